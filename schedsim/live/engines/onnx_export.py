"""ONNX models for the ONNX Runtime and TensorRT backends: checks, export, a torch-free builder.

- :func:`inspect_onnx` reads a user's file and refuses, as one-line InputErrors, a file
  that is not ONNX and a model whose inputs have no dynamic batch axis (axis 0).
- :func:`export_builtin` exports a builtin encoder (``schedsim.live.engines.torch_encoder``)
  with dynamic batch and sequence axes through ``torch.onnx.export``. It uses the
  TorchScript exporter (``dynamo=False``): the torch.export-based one, the default since
  torch 2.9, needs the extra package ``onnxscript``, and both give the same graph here.
- :func:`make_encoder_onnx` builds the same BERT-like architecture with ``onnx.helper``
  and numpy alone, so CI and machines without torch get an encoder to measure.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.live.engines.base import require

BATCH_AXIS = 0
SEQ_AXIS = 1
DEFAULT_VOCAB = 100  # ids for a model whose vocabulary cannot be read off its graph


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, element type, and which axes follow the batch and seq_len."""

    name: str
    """Tensor name in the graph."""
    dtype: np.dtype
    """numpy element type."""
    dims: tuple
    """Each axis: an int when fixed, None when dynamic."""
    vocab: int = DEFAULT_VOCAB
    """For integer ids: draw them below this (the embedding table's rows when known)."""

    @property
    def seq_axis(self) -> int | None:
        """Axis 1 when it is dynamic (token inputs [batch, seq, ...]), else None."""
        return SEQ_AXIS if len(self.dims) > SEQ_AXIS and self.dims[SEQ_AXIS] is None else None

    def shape_for(self, batch: int, seq_len: int) -> tuple:
        """The concrete shape of this input for one cell."""
        shape = list(self.dims)
        shape[BATCH_AXIS] = batch
        if self.seq_axis is not None:
            shape[SEQ_AXIS] = seq_len
        if any(d is None for d in shape):
            raise InputError(f"input {self.name!r} has a dynamic axis other than batch (0) "
                             f"and sequence (1): {self.dims}; schedsim cannot choose its size")
        return tuple(shape)


@dataclass(frozen=True)
class OnnxInfo:
    """What the profiler needs to know about an ONNX file."""

    path: Path
    sha256: str
    inputs: tuple
    """InputSpec per graph input (initializers excluded)."""
    outputs: tuple
    """Output tensor names."""
    opset: int


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def inspect_onnx(path: str | os.PathLike) -> OnnxInfo:
    """Load and check an ONNX model; InputError when it is unusable for profiling."""
    onnx = require("onnx", "onnx", "reading an ONNX model")
    from onnx import helper

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: --model: no such file (give an .onnx file or builtin:NAME)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for non-ONNX bytes
        raise InputError(f"{path}: --model: not an ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'})") from None
    graph = model.graph
    if not graph.node or not graph.input:
        raise InputError(f"{path}: --model: not an ONNX model (no graph nodes or inputs)")
    inits = {t.name: t for t in graph.initializer}
    vocab = _vocabularies(graph, inits)
    specs = []
    for vi in graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        if not dims or dims[BATCH_AXIS] is not None:
            raise InputError(f"{path}: input {vi.name!r}: no dynamic batch axis (shape "
                             f"{list(dims)}); export with a symbolic first dimension, e.g. "
                             f"torch.onnx.export(..., dynamic_axes={{{vi.name!r}: {{0: 'batch'}}}})")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        specs.append(InputSpec(vi.name, dtype, dims, vocab.get(vi.name, DEFAULT_VOCAB)))
    if not specs:
        raise InputError(f"{path}: --model: the graph has no runtime inputs")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return OnnxInfo(path, file_sha256(path), tuple(specs),
                    tuple(o.name for o in graph.output), opset)


def _vocabularies(graph, inits) -> dict:
    """Input name -> rows of the embedding table it indexes (a Gather on an initializer)."""
    out = {}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in inits:
            rows = inits[node.input[0]].dims[0] if inits[node.input[0]].dims else 0
            if rows > 0:
                out[node.input[1]] = min(out.get(node.input[1], rows), rows)
    return out


def export_builtin(name: str, path: str | os.PathLike, *, seed: int = 0,
                   opset: int = 17) -> Path:
    """Export builtin encoder ``name`` (fp32) to ``path`` with dynamic batch and seq axes."""
    torch = require("torch", "torch", f"exporting builtin:{name} to ONNX")
    from schedsim.live.engines.torch_encoder import CONFIGS, build_encoder

    if name not in CONFIGS:
        raise InputError(f"--model builtin:{name}: only the encoders {sorted(CONFIGS)} export "
                         f"to ONNX (the decoders run on the torch backend)")
    import warnings

    model = build_encoder(name, "cpu", torch.float32, seed=seed)
    ids = torch.zeros(2, 16, dtype=torch.int64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(model, (ids,), str(tmp), input_names=["input_ids"],
                          output_names=["pooled"], opset_version=opset, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "pooled": {0: "batch"}})
    os.replace(tmp, path)
    return path


def builtin_onnx(name: str, cache_dir: str | os.PathLike, *, seed: int = 0) -> Path:
    """The exported ONNX file of a builtin encoder, made once per (name, seed, torch version)."""
    torch = require("torch", "torch", f"exporting builtin:{name} to ONNX")
    path = Path(cache_dir) / f"{name}-seed{seed}-torch{torch.__version__.replace('+', '_')}.onnx"
    if not path.is_file():
        export_builtin(name, path, seed=seed)
    return path


# -- a torch-free builder ------------------------------------------------------------

def make_encoder_onnx(path: str | os.PathLike, *, layers: int = 2, hidden: int = 128,
                      heads: int = 2, ffn: int = 512, vocab: int = 30522,
                      max_positions: int = 512, seed: int = 0, opset: int = 17) -> Path:
    """Write a BERT-like encoder (bert-tiny's shape by default) with onnx.helper and numpy.

    Embeddings (word + position + token type 0), LayerNorm, ``layers`` post-LN layers of
    multi-head attention and a GELU (erf) feed-forward block, then BERT's tanh pooler on
    the first token. Input ``input_ids`` int64 [batch, seq]; output ``pooled`` float32
    [batch, hidden]. Weights are normal(0, 0.02) from ``seed``.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    from onnx import TensorProto, helper, numpy_helper

    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    hd = hidden // heads

    def w(name, shape, value=None):
        arr = (rng.normal(0.0, 0.02, size=shape) if value is None
               else np.broadcast_to(value, shape)).astype(np.float32)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(name, values, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def linear(x, name, n_in, n_out):
        y = node("MatMul", [x, w(f"{name}.w", (n_in, n_out))], f"{name}.mm")
        return node("Add", [y, w(f"{name}.b", (n_out,), 0.0)], f"{name}.out")

    def layer_norm(x, name):
        return node("LayerNormalization", [x, w(f"{name}.g", (hidden,), 1.0),
                                          w(f"{name}.b", (hidden,), 0.0)],
                    f"{name}.out", axis=-1, epsilon=1e-12)

    # Embeddings: word + position[:seq] + token_type[0]
    word = node("Gather", [w("word", (vocab, hidden)), "input_ids"], "emb.word")
    shape = node("Shape", ["input_ids"], "ids.shape")
    seq = node("Gather", [shape, const("one", 1)], "ids.seq")
    pos_ids = node("Range", [const("zero", 0), seq, const("step", 1)], "pos.ids")
    pos = node("Gather", [w("position", (max_positions, hidden)), pos_ids], "emb.pos")
    x = node("Add", [word, pos], "emb.sum")
    x = node("Add", [x, w("token_type0", (hidden,))], "emb.all")
    x = layer_norm(x, "emb.ln")
    split_shape = const("heads.shape", [0, 0, heads, hd])
    merge_shape = const("merge.shape", [0, 0, hidden])
    scale = w("attn.scale", (), 1.0 / np.sqrt(hd))
    for i in range(layers):
        p = f"l{i}"
        heads_of = {}
        for part in ("q", "k", "v"):
            y = linear(x, f"{p}.{part}", hidden, hidden)
            y = node("Reshape", [y, split_shape], f"{p}.{part}.split")
            perm = [0, 2, 3, 1] if part == "k" else [0, 2, 1, 3]
            heads_of[part] = node("Transpose", [y], f"{p}.{part}.t", perm=perm)
        s = node("MatMul", [heads_of["q"], heads_of["k"]], f"{p}.scores")
        s = node("Mul", [s, scale], f"{p}.scaled")
        a = node("Softmax", [s], f"{p}.probs", axis=-1)
        a = node("MatMul", [a, heads_of["v"]], f"{p}.ctx")
        a = node("Transpose", [a], f"{p}.ctx.t", perm=[0, 2, 1, 3])
        a = node("Reshape", [a, merge_shape], f"{p}.ctx.merge")
        a = linear(a, f"{p}.attn_out", hidden, hidden)
        x = layer_norm(node("Add", [x, a], f"{p}.res1"), f"{p}.ln1")
        f = linear(x, f"{p}.ffn_in", hidden, ffn)
        # GELU(f) = 0.5 f (1 + erf(f / sqrt 2)), as torch's default (exact) GELU
        e = node("Erf", [node("Mul", [f, w(f"{p}.rsqrt2", (), 1 / np.sqrt(2))], f"{p}.g0")],
                 f"{p}.g1")
        e = node("Add", [e, w(f"{p}.one", (), 1.0)], f"{p}.g2")
        f = node("Mul", [node("Mul", [f, e], f"{p}.g3"), w(f"{p}.half", (), 0.5)], f"{p}.gelu")
        f = linear(f, f"{p}.ffn_out", ffn, hidden)
        x = layer_norm(node("Add", [x, f], f"{p}.res2"), f"{p}.ln2")
    first = node("Gather", [x, const("zero_idx", 0)], "first", axis=1)
    pooled = node("Tanh", [linear(first, "pooler", hidden, hidden)], "pooled")
    graph = helper.make_graph(
        nodes, "schedsim_encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(pooled, TensorProto.FLOAT, ["batch", hidden])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="schedsim")
    model.ir_version = min(model.ir_version, 8)  # readable by older runtimes too
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
