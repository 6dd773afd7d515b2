"""TensorRT backend, written against the documented TensorRT 10 Python API.

NOT RUN: the TensorRT library cannot be installed on any machine this project has used
(see docs/howto/profile-an-engine.md). The parts below that need no library (engine
cache keys, optimization-profile shapes, calibration batching, the CUDA error check) are
unit-tested; the build and run paths follow NVIDIA's documentation and samples and have
never executed. ``tensorrt`` and ``cuda-python`` are imported lazily, and a missing one
is an InputError that names the package.

Build (:func:`build_engine`): ``trt.Builder`` -> network from ``trt.OnnxParser`` ->
``IBuilderConfig`` with a workspace memory-pool limit, a timing cache read from and
written back to disk, one optimization profile whose min/opt/max come from the requested
batch sizes and sequence lengths (:func:`profile_shapes`), and the precision:

- TensorRT 10 (weakly typed network): ``BuilderFlag.FP16`` / ``BF16`` / ``INT8`` (INT8
  with FP16 as fallback) and an ``IInt8EntropyCalibrator2`` fed representative batches
  (:class:`EntropyCalibrator`, :func:`calibration_batches`) on a calibration profile of
  one fixed shape.
- TensorRT 11 removes weak typing and implicit INT8 calibration: networks are created
  ``STRONGLY_TYPED``, precision comes from the ONNX graph (export an fp16/bf16 model, or
  put explicit Q/DQ nodes in it, e.g. with NVIDIA's ModelOpt), and no builder precision
  flag is set. ``strongly_typed=None`` picks this path when the major version is >= 11.

The serialized engine is cached as ``<cache>/<model>-<key>.engine`` where the key hashes
(model sha256, TensorRT version, GPU name, build settings) (:func:`engine_cache_key`).

Run (:class:`TrtRunner`): one execution context on its own CUDA stream; device buffers
sized for the largest shape; per shape, ``set_input_shape`` + ``set_tensor_address``;
``execute_async_v3``; optional CUDA-graph capture per shape after a first launch (TensorRT
needs one launch after a shape change before capture), falling back to plain launches
when capture fails. Every cuda-python call goes through :func:`cuda_check`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from schedsim.live.engines.base import Runner, random_inputs, require
from schedsim.live.engines.onnx_export import OnnxInfo
from schedsim.errors import InputError

CACHE_KEY_VERSION = 1


# -- pure helpers (tested without TensorRT) --------------------------------------------

class CudaError(RuntimeError):
    """A cuda-python call returned an error code."""


def cuda_check(result, call: str = "CUDA call", cudart=None):
    """Unwrap a cuda-python result tuple ``(err, *values)``; raise CudaError on an error.

    Returns None, the single value, or a tuple of values. ``cudart`` is the module that
    defines ``cudaError_t`` and ``cudaGetErrorName`` (cuda.bindings.runtime by default;
    tests pass a fake).
    """
    if cudart is None:
        cudart = import_cudart()
    if not isinstance(result, tuple):
        result = (result,)
    err, values = result[0], result[1:]
    if err != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(err)
        name = name[1] if isinstance(name, tuple) else name
        if isinstance(name, bytes):
            name = name.decode()
        raise CudaError(f"{call} failed: {name} ({int(err)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def import_cudart():
    """cuda-python's runtime API: ``cuda.bindings.runtime`` (>= 12.6), else ``cuda.cudart``."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6
        except ImportError:
            raise InputError("the tensorrt backend needs the Python package 'cuda-python' "
                             "(import cuda.bindings.runtime failed); pip install cuda-python") from None
    return cudart


def import_tensorrt():
    return require("tensorrt", "tensorrt", "the tensorrt backend (NVIDIA TensorRT 10 or 11)")


@dataclass(frozen=True)
class TrtSettings:
    """Build settings; every field goes into the engine cache key."""

    precision: str = "fp16"
    """fp32, fp16, bf16 or int8."""
    workspace_gib: float = 4.0
    """Workspace memory-pool limit."""
    strongly_typed: bool | None = None
    """None: strongly typed on TensorRT >= 11, weakly typed (builder flags) before."""
    opt: str = "max"
    """Optimization-profile opt point: 'max' or 'median' of the requested sizes."""
    builder_optimization_level: int = 3
    """TensorRT's default is 3 (0..5)."""
    calibration_batches: int = 16
    """INT8: how many representative batches the calibrator reads."""
    calibration_batch_size: int = 8
    """INT8: samples per calibration batch."""


def engine_cache_key(model_sha256: str, trt_version: str, gpu_name: str,
                     settings: TrtSettings, shapes: dict) -> str:
    """24 hex digits that change when anything that shapes the engine changes."""
    payload = json.dumps({"v": CACHE_KEY_VERSION, "model": model_sha256, "trt": trt_version,
                          "gpu": gpu_name, "settings": asdict(settings),
                          "shapes": {k: [list(s) for s in v] for k, v in sorted(shapes.items())}},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def engine_path(cache_dir: str | os.PathLike, model_path: str | os.PathLike, key: str) -> Path:
    return Path(cache_dir) / f"{Path(model_path).stem}-{key}.engine"


def _pick(values: Sequence[int], how: str) -> int:
    v = sorted(set(values))
    if how == "max":
        return v[-1]
    if how == "median":
        return v[(len(v) - 1) // 2]
    raise InputError(f"opt={how!r}: expected 'max' or 'median'")


def profile_shapes(inputs, batches: Sequence[int], seq_lens: Sequence[int],
                   opt: str = "max") -> dict:
    """Input name -> (min, opt, max) shapes covering every requested (batch, seq_len).

    Axis 0 takes min/opt/max of ``batches``; a dynamic axis 1 takes those of ``seq_lens``;
    fixed axes keep their size. A fixed axis 1 that disagrees with a requested seq_len,
    or any other dynamic axis, is an InputError.
    """
    if not batches or not seq_lens:
        raise InputError("profile_shapes: need at least one batch size and one seq_len")
    b = (min(batches), _pick(batches, opt), max(batches))
    s = (min(seq_lens), _pick(seq_lens, opt), max(seq_lens))
    out = {}
    for spec in inputs:
        if spec.seq_axis is None and len(spec.dims) == 2 and set(seq_lens) != {spec.dims[1]}:
            raise InputError(f"input {spec.name!r} has a fixed sequence length {spec.dims[1]}; "
                             f"--seq-lens {','.join(map(str, seq_lens))} is outside the model")
        shapes = []
        for i in range(3):
            shape = list(spec.dims)
            shape[0] = b[i]
            if spec.seq_axis is not None:
                shape[1] = s[i]
            if any(d is None for d in shape):
                raise InputError(f"input {spec.name!r}: dynamic axes other than batch and "
                                 f"sequence are not supported ({spec.dims})")
            shapes.append(tuple(shape))
        out[spec.name] = tuple(shapes)
    return out


def check_in_profile(shapes: dict, name: str, shape: Sequence[int]) -> None:
    """InputError when ``shape`` lies outside the engine's (min, max) for input ``name``."""
    lo, _, hi = shapes[name]
    if len(shape) != len(lo) or any(not (a <= x <= c) for a, x, c in zip(lo, shape, hi)):
        raise InputError(f"input {name!r}: shape {tuple(shape)} is outside the engine's "
                         f"optimization profile (min {tuple(lo)}, max {tuple(hi)}); "
                         f"rebuild with the batch sizes and seq_lens you want to measure")


def calibration_shapes(shapes: dict, batch: int) -> dict:
    """Input name -> the one shape INT8 calibration runs at: ``batch`` x the opt shape's rest."""
    return {name: (batch, *opt[1:]) for name, (lo, opt, hi) in shapes.items()}


def calibration_batches(data: np.ndarray, batch: int, count: int) -> Iterator[np.ndarray]:
    """``count`` batches of ``batch`` rows from ``data`` [N, ...], wrapping around.

    TensorRT calibrates on one fixed shape, so every batch is full: the last rows wrap to
    the start of ``data`` instead of making a short batch.
    """
    data = np.asarray(data)
    if data.ndim < 1 or len(data) == 0:
        raise InputError("calibration data is empty")
    if batch < 1 or count < 0:
        raise ValueError(f"batch={batch} must be >= 1 and count={count} >= 0")
    n = len(data)
    for i in range(count):
        idx = (np.arange(batch) + i * batch) % n
        yield np.ascontiguousarray(data[idx])


def synthetic_calibration_data(inputs, rows: int, seq_len: int,
                               rng: np.random.Generator) -> dict:
    """Representative rows per input when the user has none: valid random token ids.

    Random ids give INT8 scales that time like real ones but say nothing about accuracy.
    """
    batch = random_inputs(inputs, rows, seq_len, rng)
    return {k: np.ascontiguousarray(v) for k, v in batch.items()}


# -- build (needs TensorRT) ------------------------------------------------------------

def _logger(trt):
    return trt.Logger(trt.Logger.WARNING)


def make_calibrator(trt, cudart, data: dict, batch: int, count: int, cache_file: Path):
    """An IInt8EntropyCalibrator2 that feeds ``count`` batches of ``data`` (input -> rows)."""

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._iters = {k: calibration_batches(v, batch, count) for k, v in data.items()}
            self._dev = {k: cuda_check(cudart.cudaMalloc(v[:batch].nbytes), "cudaMalloc", cudart)
                         for k, v in data.items()}

        def get_batch_size(self):
            return batch

        def get_batch(self, names):
            try:
                host = {k: next(it) for k, it in self._iters.items()}
            except StopIteration:
                return None  # tells TensorRT that calibration data is exhausted
            for k, arr in host.items():
                cuda_check(cudart.cudaMemcpy(self._dev[k], arr.ctypes.data, arr.nbytes,
                                             cudart.cudaMemcpyKind.cudaMemcpyHostToDevice),
                           "cudaMemcpy (calibration)", cudart)
            return [int(self._dev[n]) for n in names]

        def read_calibration_cache(self):
            return cache_file.read_bytes() if cache_file.is_file() else None

        def write_calibration_cache(self, cache):
            cache_file.write_bytes(bytes(cache))

        def free(self):
            for ptr in self._dev.values():
                cuda_check(cudart.cudaFree(ptr), "cudaFree", cudart)
            self._dev = {}

    return EntropyCalibrator()


def build_engine(info: OnnxInfo, settings: TrtSettings, shapes: dict, cache_dir: Path,
                 gpu_name: str, rng: np.random.Generator) -> tuple[Path, bool]:
    """Build (or find in the cache) the engine; returns (path, built_now)."""
    trt = import_tensorrt()
    cudart = import_cudart()
    key = engine_cache_key(info.sha256, trt.__version__, gpu_name, settings, shapes)
    path = engine_path(cache_dir, info.path, key)
    if path.is_file():
        return path, False
    cache_dir.mkdir(parents=True, exist_ok=True)
    logger = _logger(trt)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    strongly_typed = settings.strongly_typed if settings.strongly_typed is not None else major >= 11
    flags = 0
    if strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)  # explicit batch is the only mode in TRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(info.path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise InputError(f"{info.path}: TensorRT's ONNX parser refused the model: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(settings.workspace_gib * 2**30))
    config.builder_optimization_level = settings.builder_optimization_level
    timing_file = cache_dir / f"timing-{gpu_name.replace(' ', '_')}-trt{trt.__version__}.cache"
    timing = config.create_timing_cache(timing_file.read_bytes() if timing_file.is_file() else b"")
    config.set_timing_cache(timing, ignore_mismatch=False)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    calibrator = None
    if strongly_typed:
        pass  # precision is the graph's own (TensorRT 11): no flag; recorded in the key
    elif settings.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif settings.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    elif settings.precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers without INT8 kernels fall back to fp16
        # Calibration runs on one fixed shape: the calibration batch at the opt seq_len.
        calib = calibration_shapes(shapes, settings.calibration_batch_size)
        cprof = builder.create_optimization_profile()
        for name, shape in calib.items():
            cprof.set_shape(name, shape, shape, shape)
        config.set_calibration_profile(cprof)
        seq = calib[info.inputs[0].name][1] if info.inputs[0].seq_axis is not None else 0
        data = synthetic_calibration_data(
            info.inputs, settings.calibration_batches * settings.calibration_batch_size, seq, rng)
        calibrator = make_calibrator(trt, cudart, data, settings.calibration_batch_size,
                                     settings.calibration_batches,
                                     cache_dir / f"{info.path.stem}-{key}.calib")
        config.int8_calibrator = calibrator
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None:
            calibrator.free()
    if serialized is None:
        raise InputError(f"{info.path}: TensorRT could not build an engine with {settings} "
                         f"(see TensorRT's log above)")
    timing_file.write_bytes(bytes(config.get_timing_cache().serialize()))
    tmp = path.with_suffix(".engine.tmp")
    tmp.write_bytes(bytes(serialized))
    os.replace(tmp, path)
    return path, True


# -- run (needs TensorRT and cuda-python) ----------------------------------------------

_CTYPES = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float16): ctypes.c_uint16,
           np.dtype(np.int64): ctypes.c_int64, np.dtype(np.int32): ctypes.c_int32,
           np.dtype(np.int8): ctypes.c_int8, np.dtype(np.bool_): ctypes.c_bool,
           np.dtype(np.uint8): ctypes.c_uint8}


class TrtRunner(Runner):
    """One TensorRT execution context on one stream, with pinned host and device buffers."""

    def __init__(self, engine_file: Path, info: OnnxInfo, shapes: dict, *,
                 cuda_graphs: bool = False, seed: int = 0):
        self.engine_file = Path(engine_file)
        self.info = info
        self.shapes = shapes
        self.cuda_graphs = cuda_graphs
        self.warnings: list[str] = []
        self._rng = np.random.default_rng(seed)
        self._graphs: dict = {}
        self._staged: dict = {}
        self._allocs: list = []
        self._gpu_ms = float("nan")

    def __enter__(self) -> "TrtRunner":
        trt, cudart = import_tensorrt(), import_cudart()
        self._trt, self._cudart = trt, cudart
        self._runtime = trt.Runtime(_logger(trt))
        self._engine = self._runtime.deserialize_cuda_engine(self.engine_file.read_bytes())
        if self._engine is None:
            raise InputError(f"{self.engine_file}: TensorRT could not deserialize the engine "
                             f"(built by another TensorRT version or for another GPU?)")
        self._context = self._engine.create_execution_context()
        self._stream = self._check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._ev = [self._check(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(2)]
        self._io = {}
        for i in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(i)
            is_input = self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            self._io[name] = (is_input, dtype)
        # Buffers for the largest shape: every input at its max; outputs as the context
        # reports them once the inputs are set to max.
        for name, (lo, opt, hi) in self.shapes.items():
            self._context.set_input_shape(name, hi)
        self._dev, self._host = {}, {}
        for name, (is_input, dtype) in self._io.items():
            shape = tuple(self._context.get_tensor_shape(name))
            nbytes = int(np.prod(shape)) * dtype.itemsize
            self._dev[name] = self._alloc(cudart.cudaMalloc, nbytes, "cudaMalloc")
            host_ptr = self._alloc(cudart.cudaMallocHost, nbytes, "cudaMallocHost")
            buf = (_CTYPES[dtype] * (nbytes // dtype.itemsize)).from_address(int(host_ptr))
            self._host[name] = np.frombuffer(buf, dtype=dtype)
            self._context.set_tensor_address(name, int(self._dev[name]))
        return self

    def _check(self, result, call):
        return cuda_check(result, call, self._cudart)

    def _alloc(self, fn, nbytes, call):
        ptr = self._check(fn(nbytes), call)
        self._allocs.append((call, ptr))
        return ptr

    def __exit__(self, *exc) -> None:
        cudart = self._cudart
        self._check(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        for exec_graph in self._graphs.values():
            if exec_graph is not None:
                self._check(cudart.cudaGraphExecDestroy(exec_graph), "cudaGraphExecDestroy")
        for call, ptr in reversed(self._allocs):
            free = cudart.cudaFree if call == "cudaMalloc" else cudart.cudaFreeHost
            self._check(free(ptr), call.replace("Malloc", "Free"))
        for ev in self._ev:
            self._check(cudart.cudaEventDestroy(ev), "cudaEventDestroy")
        self._check(cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
        self._allocs, self._graphs = [], {}
        self._context = self._engine = self._runtime = None

    def _set_shape(self, batch: int, seq_len: int) -> dict:
        shapes = {}
        for spec in self.info.inputs:
            shape = spec.shape_for(batch, seq_len)
            check_in_profile(self.shapes, spec.name, shape)
            if not self._context.set_input_shape(spec.name, shape):
                raise InputError(f"input {spec.name!r}: TensorRT refused shape {shape}")
            shapes[spec.name] = shape
        return shapes

    def prepare(self, batch: int, seq_len: int) -> None:
        shapes = self._set_shape(batch, seq_len)
        data = random_inputs(self.info.inputs, batch, seq_len, self._rng)
        self._staged[(batch, seq_len)] = {n: (shapes[n], data[n]) for n in shapes}
        self._launch(batch, seq_len)  # first launch after a shape change, before any capture
        if self.cuda_graphs:
            self._graphs[(batch, seq_len)] = self._capture(batch, seq_len)

    def _copy_in(self, key) -> None:
        cudart = self._cudart
        for name, (shape, data) in self._staged[key].items():
            view = self._host[name][:data.size]
            view[:] = data.ravel()
            self._check(cudart.cudaMemcpyAsync(self._dev[name], view.ctypes.data, data.nbytes,
                                               cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                               self._stream), "cudaMemcpyAsync H2D")

    def _copy_out(self) -> np.ndarray:
        cudart = self._cudart
        out = None
        for name, (is_input, dtype) in self._io.items():
            if is_input:
                continue
            shape = tuple(self._context.get_tensor_shape(name))
            n = int(np.prod(shape))
            self._check(cudart.cudaMemcpyAsync(self._host[name].ctypes.data, self._dev[name],
                                               n * dtype.itemsize,
                                               cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                               self._stream), "cudaMemcpyAsync D2H")
            if out is None:
                out = self._host[name][:n].reshape(shape)
        return out

    def _launch(self, batch: int, seq_len: int) -> None:
        if not self._context.execute_async_v3(self._stream):
            raise RuntimeError(f"execute_async_v3 failed at batch={batch} seq_len={seq_len}")

    def _capture(self, batch: int, seq_len: int):
        cudart = self._cudart
        try:
            self._check(cudart.cudaStreamBeginCapture(
                self._stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
                "cudaStreamBeginCapture")
            self._launch(batch, seq_len)
            graph = self._check(cudart.cudaStreamEndCapture(self._stream), "cudaStreamEndCapture")
            exec_graph = self._check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
            self._check(cudart.cudaGraphDestroy(graph), "cudaGraphDestroy")
            return exec_graph
        except (CudaError, RuntimeError) as exc:
            # End a capture left open, clear the sticky error, and launch plainly.
            cudart.cudaStreamEndCapture(self._stream)
            cudart.cudaGetLastError()
            self.warnings.append(f"CUDA graph capture failed for batch={batch} "
                                 f"seq_len={seq_len}, launching plainly: {exc}")
            return None

    def host_input(self, batch: int, seq_len: int) -> np.ndarray:
        return self._staged[(batch, seq_len)][self.info.inputs[0].name][1]

    def infer(self, batch: int, seq_len: int):
        key = (batch, seq_len)
        cudart = self._cudart
        self._set_shape(batch, seq_len)
        self._copy_in(key)
        self._check(cudart.cudaEventRecord(self._ev[0], self._stream), "cudaEventRecord")
        graph = self._graphs.get(key)
        if graph is not None:
            self._check(cudart.cudaGraphLaunch(graph, self._stream), "cudaGraphLaunch")
        else:
            self._launch(batch, seq_len)
        self._check(cudart.cudaEventRecord(self._ev[1], self._stream), "cudaEventRecord")
        out = self._copy_out()
        self._check(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        self._gpu_ms = float(self._check(cudart.cudaEventElapsedTime(*self._ev),
                                         "cudaEventElapsedTime"))
        return out

    @property
    def last_gpu_ms(self) -> float:
        return self._gpu_ms

    def describe(self) -> dict:
        return {"tensorrt": self._trt.__version__ if hasattr(self, "_trt") else None,
                "engine_file": self.engine_file.name, "cuda_graphs": self.cuda_graphs,
                "graph_shapes": sum(g is not None for g in self._graphs.values()),
                "profile_shapes": {k: [list(s) for s in v] for k, v in self.shapes.items()}}
