"""ONNX Runtime runner: one InferenceSession on one execution provider.

Precision: ``fp32`` runs the file as it is; ``fp16`` converts float weights and
activations with ONNX Runtime's own converter (inputs and outputs keep their types);
``int8`` quantizes weights dynamically (``onnxruntime.quantization.quantize_dynamic``).
``bf16`` is refused. The converted model is written next to the exported one.

Each :meth:`infer` is ``session.run`` on the staged numpy inputs: with a GPU provider the
host-to-device and device-to-host copies are inside it, as in a serving loop. ONNX
Runtime exposes no device clock, so ``last_gpu_ms`` is NaN.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schedsim.live.engines.base import Runner, is_out_of_memory, random_inputs, require
from schedsim.live.engines.onnx_export import OnnxInfo
from schedsim.errors import InputError

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider",
}


def resolve_provider(name: str | None) -> str:
    """``cuda`` or ``CUDAExecutionProvider`` -> the provider's full name, checked as available."""
    ort = require("onnxruntime", "onnxruntime", "the onnxruntime backend")
    available = ort.get_available_providers()
    full = PROVIDER_ALIASES.get((name or "cpu").lower(), name or "CPUExecutionProvider")
    if full not in available:
        raise InputError(f"--provider {name}: {full} is not available in this onnxruntime "
                         f"build (available: {', '.join(available)})")
    return full


def converted_model(info: OnnxInfo, precision: str, work_dir: Path) -> Path:
    """The model file to load for ``precision`` (converted once, cached by the source hash)."""
    if precision == "fp32":
        return info.path
    if precision == "bf16":
        raise InputError("--precision bf16: the onnxruntime backend supports fp32, fp16 "
                         "and int8")
    out = Path(work_dir) / f"{info.path.stem}-{info.sha256[:12]}-{precision}.onnx"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if precision == "fp16":
        onnx = require("onnx", "onnx", "converting a model to fp16")
        float16 = require("onnxruntime.transformers.float16", "onnxruntime",
                          "converting a model to fp16")
        model = float16.convert_float_to_float16(onnx.load(str(info.path)), keep_io_types=True)
        onnx.save(model, str(out))
    elif precision == "int8":
        quant = require("onnxruntime.quantization", "onnxruntime", "int8 quantization")
        quant.quantize_dynamic(str(info.path), str(out), weight_type=quant.QuantType.QInt8)
    else:
        raise InputError(f"--precision {precision}: not one of fp32, fp16, int8 for onnxruntime")
    return out


class OrtRunner(Runner):
    """Serve batches through one ONNX Runtime session."""

    def __init__(self, info: OnnxInfo, model_path: Path, *, provider: str,
                 seed: int = 0, intra_op_threads: int | None = None):
        self.info = info
        self.model_path = Path(model_path)
        self.provider = provider
        self.intra_op_threads = intra_op_threads
        self.warnings: list[str] = []
        self._rng = np.random.default_rng(seed)
        self._inputs: dict[tuple[int, int], dict] = {}
        self._session = None

    def __enter__(self) -> "OrtRunner":
        ort = require("onnxruntime", "onnxruntime", "the onnxruntime backend")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Fatal only: a failed run is reported once, as schedsim's own one-line error.
        opts.log_severity_level = 4
        if self.intra_op_threads:
            opts.intra_op_num_threads = self.intra_op_threads
        try:
            self._session = ort.InferenceSession(str(self.model_path), opts,
                                                 providers=[self.provider])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise InputError(f"{self.model_path}: onnxruntime cannot load the model: "
                             f"{str(exc).splitlines()[0]}") from None
        return self

    def __exit__(self, *exc) -> None:
        self._session = None
        self._inputs.clear()

    def prepare(self, batch: int, seq_len: int) -> None:
        for spec in self.info.inputs:
            fixed = spec.dims[1] if len(spec.dims) > 1 else None
            if spec.seq_axis is None and fixed is not None and len(spec.dims) == 2 \
                    and fixed != seq_len:
                raise InputError(f"{self.info.path}: input {spec.name!r} has a fixed sequence "
                                 f"length {fixed}; seq_len={seq_len} is outside the model")
        self._inputs[(batch, seq_len)] = random_inputs(self.info.inputs, batch, seq_len, self._rng)
        try:
            self.infer(batch, seq_len)  # first run: allocations, kernel choice
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise
            raise InputError(f"{self.info.path}: onnxruntime failed at batch={batch} "
                             f"seq_len={seq_len}: {str(exc).splitlines()[0]}") from None

    def host_input(self, batch: int, seq_len: int) -> np.ndarray:
        if (batch, seq_len) not in self._inputs:
            self.prepare(batch, seq_len)
        return self._inputs[(batch, seq_len)][self.info.inputs[0].name]

    def infer(self, batch: int, seq_len: int):
        return self._session.run(None, self._inputs[(batch, seq_len)])[0]

    def describe(self) -> dict:
        import onnxruntime as ort

        return {"provider": self.provider, "onnxruntime": ort.__version__,
                "model_file": self.model_path.name, "intra_op_threads": self.intra_op_threads}
