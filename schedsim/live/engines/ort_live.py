"""ONNX Runtime for live runs: a BERT-like encoder built with ``onnx.helper``, and its runner.

:func:`build_encoder_onnx` writes the builtin encoders of
:mod:`schedsim.live.engines.torch_encoder` (same shapes: embeddings, post-LayerNorm layers,
GELU feed-forward, tanh pooler; random weights from a seeded numpy generator) as an
ONNX graph with dynamic batch and sequence axes, without needing torch.
:class:`OrtRunner` serves batches of any ONNX model whose first input is token ids
[batch, seq_len]: one ``InferenceSession`` per runner, ``intra_op_threads`` threads each.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from schedsim.errors import InputError

_CONFIGS = {  # name: (layers, hidden, heads, ffn, vocab, max_positions), as torch_encoder.CONFIGS
    "bert-base": (12, 768, 12, 3072, 30522, 512),
    "bert-tiny": (2, 128, 2, 512, 30522, 512),
}
OPSET = 17


def build_encoder_onnx(name: str, path, *, seed: int = 0) -> Path:
    """Write the builtin encoder ``name`` (bert-tiny, bert-base) to ``path`` as ONNX; return it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if name not in _CONFIGS:
        raise InputError(f"--model builtin:{name}: unknown; builtin models: {', '.join(_CONFIGS)}")
    layers, hid, heads, ffn, vocab, max_pos = _CONFIGS[name]
    hd = hid // heads
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def w(nm, *shape, value=None):
        arr = (rng.normal(0.0, 0.02, shape) if value is None else np.full(shape, value)).astype(np.float32)
        inits.append(numpy_helper.from_array(arr, nm))
        return nm

    def const(nm, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def layer_norm(x, nm):
        return node("LayerNormalization", [x, w(f"{nm}.g", hid, value=1.0), w(f"{nm}.b", hid, value=0.0)],
                    nm, axis=-1, epsilon=1e-12)

    def linear(x, nm, n_in, n_out):
        return node("Add", [node("MatMul", [x, w(f"{nm}.w", n_in, n_out)], f"{nm}.mm"),
                            w(f"{nm}.bias", n_out, value=0.0)], nm)

    seq = node("Shape", ["input_ids"], "seq", start=1, end=2)
    pos = node("Slice", [w("pos_emb", max_pos, hid), const("zero", np.array([0], np.int64)), seq,
                         const("axis0", np.array([0], np.int64))], "pos")
    x = node("Gather", [w("word_emb", vocab, hid), "input_ids"], "word")
    x = node("Add", [node("Add", [x, pos], "emb0"), w("type_emb", hid)], "emb1")
    x = layer_norm(x, "emb_ln")
    const("qkv_shape", np.array([0, 0, 3, heads, hd], np.int64))
    const("hid_shape", np.array([0, 0, hid], np.int64))
    const("scale", np.array(1.0 / math.sqrt(hd), np.float32))
    const("half", np.array(0.5, np.float32))
    const("one", np.array(1.0, np.float32))
    const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    for i in range(layers):
        p = f"l{i}"
        qkv = node("Transpose", [node("Reshape", [linear(x, f"{p}.qkv", hid, 3 * hid), "qkv_shape"], f"{p}.r")],
                   f"{p}.t", perm=[2, 0, 3, 1, 4])  # [3, b, heads, s, hd]
        q, k, v = (node("Gather", [qkv, const(f"{p}.i{j}", np.array(j, np.int64))], f"{p}.{c}", axis=0)
                   for j, c in enumerate("qkv"))
        kt = node("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
        scores = node("Mul", [node("MatMul", [q, kt], f"{p}.qk"), "scale"], f"{p}.sc")
        a = node("MatMul", [node("Softmax", [scores], f"{p}.sm", axis=-1), v], f"{p}.av")
        a = node("Reshape", [node("Transpose", [a], f"{p}.at", perm=[0, 2, 1, 3]), "hid_shape"], f"{p}.ar")
        x = layer_norm(node("Add", [x, linear(a, f"{p}.o", hid, hid)], f"{p}.res1"), f"{p}.ln1")
        f = linear(x, f"{p}.f1", hid, ffn)
        erf = node("Erf", [node("Div", [f, "sqrt2"], f"{p}.fd")], f"{p}.erf")
        g = node("Mul", [node("Mul", [f, "half"], f"{p}.fh"), node("Add", [erf, "one"], f"{p}.e1")], f"{p}.gelu")
        x = layer_norm(node("Add", [x, linear(g, f"{p}.f2", ffn, hid)], f"{p}.res2"), f"{p}.ln2")
    first = node("Gather", [x, const("tok0", np.array(0, np.int64))], "cls", axis=1)
    node("Tanh", [linear(first, "pool", hid, hid)], "pooled")
    graph = helper.make_graph(
        nodes, f"schedsim-{name}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq_len"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", hid])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="schedsim")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class OrtRunner:
    """Serve batches of an ONNX model with ONNX Runtime (a context manager).

    The first model input takes the token ids [batch, seq_len]; fixed dimensions in its
    shape become ``max_batch`` / ``max_seq_len`` (checked against the trace before a
    run). ``last_issue_ns`` / ``last_done_ns`` bracket ``session.run``.
    """

    def __init__(self, path, *, intra_op_threads: int = 1, device: str = "cpu", vocab: int | None = None,
                 max_seq_len: int | None = None):
        self.path = Path(path)
        self.intra_op_threads = intra_op_threads
        self.device = device
        self.vocab = vocab
        self.max_batch = None
        self.max_seq_len = max_seq_len
        self.last_issue_ns = self.last_done_ns = 0
        self.last_gpu_ms = math.nan
        self._buffers: dict = {}
        self._session = None

    def __enter__(self) -> "OrtRunner":
        import onnxruntime as ort

        if not self.path.is_file():
            raise InputError(f"--model {self.path}: no such file")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers = ["CPUExecutionProvider"]
        if self.device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise InputError("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                                 "(install onnxruntime-gpu), or use --device cpu")
            providers = ["CUDAExecutionProvider"]
        try:
            self._session = ort.InferenceSession(str(self.path), opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - a broken model file is bad input
            raise InputError(f"--model {self.path}: onnxruntime cannot load it: {' '.join(str(exc).split())[:300]}") from exc
        inp = self._session.get_inputs()[0]
        if len(inp.shape) != 2:
            raise InputError(f"--model {self.path}: first input {inp.name!r} has shape {inp.shape}; "
                             "expected token ids [batch, seq_len]")
        self._input = inp.name
        self._dtype = np.int32 if inp.type == "tensor(int32)" else np.int64
        b, s = inp.shape
        self.max_batch = b if isinstance(b, int) else None
        if isinstance(s, int):
            self.max_seq_len = s
        self._fixed = (b if isinstance(b, int) else None, s if isinstance(s, int) else None)
        return self

    def __exit__(self, *exc) -> None:
        self._session = None
        self._buffers.clear()

    def host_input(self, batch: int, seq_len: int) -> np.ndarray:
        """An int64 staging array [batch, seq_len] to fill before :meth:`infer`."""
        buf = self._buffers.get((batch, seq_len))
        if buf is None:
            buf = self._buffers[(batch, seq_len)] = np.zeros((batch, seq_len), np.int64)
        return buf

    def infer(self, batch: int, seq_len: int, input_ids_host=None) -> np.ndarray:
        ids = self.host_input(batch, seq_len) if input_ids_host is None else input_ids_host
        if self._dtype is not np.int64:
            ids = ids.astype(self._dtype)
        self.last_issue_ns = time.perf_counter_ns()
        out = self._session.run(None, {self._input: ids})[0]
        self.last_done_ns = time.perf_counter_ns()
        return out
