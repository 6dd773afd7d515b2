"""Triton Python-backend model that serves schedsim's builtin encoders (copied as ``model.py``).

Runs inside Triton's Python stub, not in schedsim's process. The stub's ``sys.path`` holds
only its interpreter's own directories and the model's folder (it ignores PYTHONPATH), so
the directories named in ``SCHEDSIM_TRITON_SYS_PATH`` (schedsim's ``sys.path``, passed by
:mod:`schedsim.triton.server`) are added first, with ``site.addsitedir`` so that editable
installs' ``.pth`` files work.

Settings come from the config's string ``parameters``: ``model`` (bert-tiny, bert-base),
``engine`` (numpy: :class:`~schedsim.triton.numpy_encoder.NumpyEncoder`, for KIND_CPU;
torch: :class:`~schedsim.live.engines.torch_encoder.TorchEncoderRunner`, one CUDA graph per
batch size on KIND_GPU), ``precision``, ``cuda_graphs``, ``seq_lens`` (comma-separated, the
shapes to capture and warm up) and ``seed``.

Outputs are returned with ``pb_utils.Tensor.from_dlpack``: with numpy 2 the backend's
``pb_utils.Tensor(name, ndarray)`` fails ("output tensor shape does not match size of
output"), while DLPack hands numpy and torch arrays over intact. Triton takes ownership of
the capsule by renaming it "used_dlpack" (not the standard "used_dltensor") and frees the
tensor itself, but numpy's capsule destructor does not know that name and raises a
ValueError that the stub prints, with its traceback, for every response: about 340 us of
compute_output per response on the CPU. :func:`_dlpack_for_triton` takes the destructor
off the capsule before handing it over, which is what the DLPack protocol expects of a
consumer that takes ownership.
"""

import ctypes
import json
import os
import site
import sys

for _p in os.environ.get("SCHEDSIM_TRITON_SYS_PATH", "").split(os.pathsep):
    if _p and _p not in sys.path:
        site.addsitedir(_p)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

INPUT_NAME, OUTPUT_NAME = "INPUT_IDS", "OUTPUT"
_capsule_set_destructor = ctypes.pythonapi.PyCapsule_SetDestructor
_capsule_set_destructor.argtypes = (ctypes.py_object, ctypes.c_void_p)
_capsule_set_destructor.restype = ctypes.c_int


def _dlpack_for_triton(array):
    """A DLPack capsule of ``array`` whose deleter only Triton will call (see the module doc)."""
    capsule = array.__dlpack__()
    _capsule_set_destructor(capsule, None)
    return capsule


class TritonPythonModel:
    """Triton's hooks: initialize, execute, finalize."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        p = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        name = p.get("model", "bert-tiny")
        seed = int(p.get("seed", "0"))
        max_batch = max(1, int(config.get("max_batch_size", 1)))
        seq_lens = [int(s) for s in p.get("seq_lens", "128").split(",") if s]
        self.engine_name = p.get("engine", "numpy")
        self._log = None
        if p.get("execution_log"):
            from schedsim.triton.execution_log import ExecutionLogWriter

            self._log = ExecutionLogWriter(p["execution_log"], args.get("model_instance_name", "instance"))
        if self.engine_name == "numpy":
            from schedsim.triton.numpy_encoder import NumpyEncoder

            encoder = NumpyEncoder(name, seed=seed)
            self._infer = encoder.infer
            self._close = None
        else:
            import torch

            from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

            gpu = args.get("model_instance_kind") == "GPU"
            device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[
                p.get("precision", "fp16" if gpu else "fp32")]
            if gpu:
                torch.cuda.set_device(torch.device(device))
            model = build_encoder(name, device, dtype, seed=seed)
            runner = TorchEncoderRunner(model, max_batch=max_batch, max_seq_len=max(seq_lens),
                                        cuda_graphs=gpu and p.get("cuda_graphs", "1") == "1")
            runner.__enter__()
            self._close = lambda: runner.__exit__(None, None, None)

            def infer(ids):
                b, s = ids.shape
                buf = runner.host_input(b, s)
                buf[...] = ids
                return np.asarray(runner.infer(b, s, buf), dtype=np.float32)

            self._infer = infer
        # Warm every shape the batcher may form (CUDA graphs are captured here), so that
        # the first batches of a run cost what later ones do.
        rng = np.random.default_rng(seed)
        for s in seq_lens:
            for b in range(1, max_batch + 1):
                self._infer(rng.integers(0, 1000, (b, s), dtype=np.int64))

    def execute(self, requests):
        began = self._log.now() if self._log is not None else 0
        ids = [pb_utils.get_input_tensor_by_name(r, INPUT_NAME).as_numpy() for r in requests]
        sizes = [a.shape[0] for a in ids]
        # The batcher only puts requests of one seq_len together (no ragged input).
        out = np.array(self._infer(np.concatenate(ids) if len(ids) > 1 else ids[0]), dtype=np.float32)
        responses, start = [], 0
        for n in sizes:
            part = out[start:start + n]
            start += n
            tensor = pb_utils.Tensor.from_dlpack(OUTPUT_NAME, _dlpack_for_triton(part))
            responses.append(pb_utils.InferenceResponse([tensor]))
        if self._log is not None:
            self._log.batch(began, self._log.now(), [r.request_id() for r in requests])
        return responses

    def finalize(self):
        if self._close is not None:
            self._close()
        if self._log is not None:
            self._log.close()
