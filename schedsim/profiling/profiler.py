"""The calibration harness: measure an engine, cell by cell, into a ``schedsim.profile/1`` table.

:func:`run_profile` opens K runners of one backend (``torch``, ``onnxruntime`` or
``tensorrt``; see ``schedsim.live.engines``), then measures every (batch, seq_len) cell in
batch-major order: prepare the shape (buffers, CUDA graph), warm up, then time calls until
the cell has ``min_iters`` samples and ``min_time_s`` seconds of them (trtexec's rule;
:func:`schedsim.profiling.measure.sample_cell`). With K > 1 instances all K run the cell at once on
their own streams and every call is timed under that contention
(:func:`schedsim.profiling.measure.sample_concurrent`). Afterwards it re-measures the first cell
(a drift check), times the host dispatch gap of a serving loop around the engine, and
stamps the machine.

Cells run one after another rather than interleaved (the default profile's script
interleaves) so that every finished cell is final: Ctrl-C, an out-of-memory batch or any
error still leaves a valid profile of the cells already measured, written with
``"partial": true`` in the sidecar. Batch-major order makes that partial table a complete
grid: all seq_lens of the smallest batch sizes. The drift check reports what
interleaving would have hidden.

This module draws no UI: the CLI passes a :class:`Progress` to show a bar per cell.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from schedsim.cost.power import step_tau_ms
from schedsim.cost.profile import save_profile
from schedsim.errors import InputError
from schedsim.live.engines import trt_runner as t
from schedsim.live.engines.base import is_out_of_memory, require
from schedsim.live.engines.onnx_export import builtin_onnx, inspect_onnx
from schedsim.live.engines.ort_runner import OrtRunner, converted_model, resolve_provider
from schedsim.profiling.host import parse_cpu, pin_cpu
from schedsim.profiling.measure import (_csv_query, gpu_state, machine_metadata, sample_cell, sample_concurrent,
                                        summarize)

BACKENDS = ("torch", "onnxruntime", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DRIFT_WARN = 0.05
"""Warn when the first cell, re-measured at the end, moved by more than this fraction."""


def parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    """'1,2,4-64' -> (1, 2, 4, 5, ..., 64): sorted, unique, each >= 1."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InputError(f"{flag}: {part!r} is not an integer or a range like 4-64") from None
        if a < 1 or b < a:
            raise InputError(f"{flag}: {part!r} must be sizes >= 1, ranges written low-high")
        out.update(range(a, b + 1))
    if not out:
        raise InputError(f"{flag}: {text!r} names no sizes")
    return tuple(sorted(out))


@dataclass(frozen=True)
class ProfileSpec:
    """What to measure and how; validated by :meth:`check`."""

    model: str
    """``builtin:NAME`` or a path to an .onnx file."""
    backend: str
    """torch, onnxruntime or tensorrt."""
    precision: str = "fp32"
    """fp32, fp16, bf16 or int8 (which ones a backend takes: see :meth:`check`)."""
    batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    """Batch sizes to measure."""
    seq_lens: tuple = (128,)
    """Sequence lengths to measure."""
    cuda_graphs: bool = False
    """Replay one CUDA graph per shape (torch, tensorrt)."""
    compile: bool = False
    """torch.compile the module (torch)."""
    instances: int = 1
    """Runners measured concurrently, one stream and thread each."""
    warmup_ms: float = 200.0
    """Warm-up per cell (per instance), ms."""
    min_iters: int = 10
    """Timed calls per cell, at least (per instance)."""
    min_time_s: float = 3.0
    """Timed seconds per cell, at least (per instance)."""
    max_cell_s: float | None = None
    """Cap on a cell's sampling phase, s; the cell is then flagged truncated."""
    device: str | None = None
    """torch: 'cuda', 'cuda:1' or 'cpu' (default: cuda when available)."""
    provider: str | None = None
    """onnxruntime: execution provider (cpu, cuda, tensorrt or a full name)."""
    tf32: bool = False
    """torch fp32: allow TF32 matrix products (PyTorch's default is off)."""
    workspace_gib: float = 4.0
    """tensorrt: workspace memory-pool limit."""
    cache_dir: str | None = None
    """Where exported ONNX files and TensorRT engines are kept."""
    dispatch_iters: int = 300
    """Batches in the dispatch-overhead loop (0 skips it)."""
    power_cap_s: float = 0.0
    """Seconds per phase of the power-cap measurement (0 skips it; one instance only):
    :func:`_power_cap`."""
    pair_s: float = 0.0
    """Seconds per pair of batch sizes in the pair-slowdown measurement (two instances only;
    0 skips it): :func:`_pair_slowdown`."""
    pair_batches: tuple | None = None
    """Batch sizes of that grid (default: the measured sizes that are powers of two, and the largest)."""
    host_variation_s: float = 0.0
    """Seconds per round of the host-variation measurement (5 rounds of the smallest cell;
    0 skips it): :mod:`schedsim.profiling.host_variation`."""
    seed: int = 0
    """Seed for weights, inputs and the dispatch loop."""
    cpu: str | None = None
    """Pin the process to this CPU (a number or ``"auto"``) before the runners open; None =
    not pinned (:func:`schedsim.profiling.host.pin_cpu`)."""

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"--backend {self.backend}: expected one of {', '.join(BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise InputError(f"--precision {self.precision}: expected one of {', '.join(PRECISIONS)}")
        if self.backend == "torch" and self.precision == "int8":
            raise InputError("--precision int8: the torch backend runs fp32, fp16 and bf16; "
                             "use --backend tensorrt or onnxruntime for int8")
        if self.backend == "onnxruntime" and (self.cuda_graphs or self.compile):
            raise InputError("--cuda-graphs/--compile: not options of the onnxruntime backend")
        if self.backend == "tensorrt" and self.compile:
            raise InputError("--compile: only the torch backend compiles")
        for name in ("instances", "min_iters"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        for name in ("warmup_ms", "min_time_s"):
            if getattr(self, name) < 0:
                raise InputError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 0")
        if self.power_cap_s < 0:
            raise InputError(f"--power-cap-s {self.power_cap_s}: must be >= 0")
        if self.power_cap_s > 0 and self.instances > 1:
            raise InputError("--power-cap-s: measured with one instance; profile it without --instances")
        if self.pair_s < 0:
            raise InputError(f"--pair-s {self.pair_s}: must be >= 0")
        if self.host_variation_s < 0:
            raise InputError(f"--host-variation-s {self.host_variation_s}: must be >= 0")
        if self.pair_s > 0 and self.instances != 2:
            raise InputError("--pair-s: measures two instances side by side; profile it with --instances 2")
        if self.pair_batches is not None and not set(self.pair_batches) <= set(self.batch_sizes):
            extra = sorted(set(self.pair_batches) - set(self.batch_sizes))
            raise InputError(f"--pair-batches: {extra} not among --batch-sizes")
        if self.max_cell_s is not None and self.max_cell_s <= 0:
            raise InputError(f"--max-cell-s {self.max_cell_s}: must be > 0")
        parse_cpu(self.cpu)

    @property
    def cells(self) -> list[tuple[int, int]]:
        """(batch, seq_len) in measuring order: batch-major, so a partial run is a full grid."""
        return [(b, s) for b in self.batch_sizes for s in self.seq_lens]


class Progress:
    """Callbacks the harness makes; the default does nothing."""

    def start(self, cells: list, spec: ProfileSpec) -> None: ...
    def cell_start(self, index: int, batch: int, seq_len: int) -> None: ...
    def cell_sample(self, n: int) -> None: ...
    def cell_done(self, index: int, batch: int, seq_len: int, stats: dict) -> None: ...
    def note(self, text: str) -> None: ...


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``outcome`` says what partial profile was kept."""

    def __init__(self, outcome: "Outcome"):
        super().__init__()
        self.outcome = outcome


@dataclass
class Outcome:
    """What :func:`run_profile` wrote."""

    path: Path | None
    """The CSV, or None when no complete grid row was measured."""
    complete: bool
    cells: int
    """Cells in the written table."""
    warnings: list = field(default_factory=list)
    error: str | None = None


# -- backends ------------------------------------------------------------------------

def _cache_dir(spec: ProfileSpec) -> Path:
    if spec.cache_dir:
        return Path(spec.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "schedsim"


def _builtin_name(model: str) -> str | None:
    return model.split(":", 1)[1] if model.startswith("builtin:") else None


def _onnx_info(spec: ProfileSpec):
    name = _builtin_name(spec.model)
    if name is not None:
        from schedsim.live.engines.torch_encoder import CONFIGS  # lazy: imports torch (seconds), after CPU pinning

        if name not in CONFIGS:
            raise InputError(f"--model builtin:{name}: the {spec.backend} backend takes the "
                             f"encoders {', '.join('builtin:' + n for n in sorted(CONFIGS))} "
                             f"or an .onnx file")
        return inspect_onnx(builtin_onnx(name, _cache_dir(spec) / "onnx", seed=spec.seed))
    return inspect_onnx(spec.model)


class _Backend:
    """Opens K runners of one spec and says what they are (for the sidecar)."""

    def __init__(self, spec: ProfileSpec):
        self.spec = spec
        self.model_meta: dict = {}
        self.timing = ""
        self.device = "cpu"
        self.backend_version = ""
        self.notes: list = []

    def open(self, stack: contextlib.ExitStack) -> list:
        return getattr(self, f"_open_{self.spec.backend}")(stack)

    # torch: builtin modules only
    def _open_torch(self, stack):
        torch = require("torch", "torch", "the torch backend")
        # lazy: the engine modules import torch (seconds), after CPU pinning
        from schedsim.live.engines import decoder, torch_encoder

        spec = self.spec
        name = _builtin_name(spec.model)
        if name is None:
            raise InputError(f"--model {spec.model}: the torch backend runs builtin models "
                             f"(builtin:bert-base, builtin:bert-tiny, builtin:llama-1b, "
                             f"builtin:llama-tiny); run .onnx files with onnxruntime or tensorrt")
        device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InputError(f"--device {device}: torch {torch.__version__} sees no CUDA GPU")
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.precision]
        torch.backends.cuda.matmul.allow_tf32 = spec.tf32
        torch.backends.cudnn.allow_tf32 = spec.tf32
        if name in torch_encoder.CONFIGS:
            cfg, desc = torch_encoder.CONFIGS[name], torch_encoder.DESCRIPTIONS[name]
            build = torch_encoder.build_encoder
        elif name in decoder.CONFIGS:
            cfg, desc = decoder.CONFIGS[name], decoder.DESCRIPTIONS[name] + "; prefill, last-token logits"
            build = decoder.build_decoder
        else:
            known = sorted(torch_encoder.CONFIGS) + sorted(decoder.CONFIGS)
            raise InputError(f"--model builtin:{name}: unknown; builtins are "
                             f"{', '.join('builtin:' + n for n in known)}")
        if max(spec.seq_lens) > cfg.max_positions:
            raise InputError(f"--seq-lens: {max(spec.seq_lens)} is outside builtin:{name}'s "
                             f"positions 1..{cfg.max_positions}")
        if spec.compile:
            import torch._dynamo  # lazy: torch costs seconds of start-up, and must load after CPU pinning

            # One graph per shape: allow as many recompiles as cells.
            limit = max(64, len(spec.cells) + 8)
            for attr in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, attr):
                    setattr(torch._dynamo.config, attr, limit)
        model = build(name, device, dtype, seed=spec.seed)
        rng = np.random.default_rng(spec.seed)
        runners = []
        for _ in range(spec.instances):
            r = stack.enter_context(torch_encoder.TorchEncoderRunner(
                model, max_batch=max(spec.batch_sizes), max_seq_len=max(spec.seq_lens),
                cuda_graphs=spec.cuda_graphs, record_gpu_time=True, compile=spec.compile))
            # Valid ids in the whole staging buffer; every shape reads a prefix of it.
            r.host_input(max(spec.batch_sizes), max(spec.seq_lens))[:] = rng.integers(
                min(1000, cfg.vocab // 2), cfg.vocab,
                size=(max(spec.batch_sizes), max(spec.seq_lens)))
            runners.append(r)
        if spec.cuda_graphs and not device.startswith("cuda"):
            self.notes.append("--cuda-graphs ignored on the CPU (eager)")
        self.device = device
        self.backend_version = torch.__version__
        self.model_meta = {"model": desc, "model_source": f"builtin:{name} (torch module, "
                           f"seed {spec.seed})", "tf32": spec.tf32}
        if device.startswith("cuda"):
            self.device = torch.cuda.get_device_name(torch.device(device))
            self.model_meta["cuda"] = torch.version.cuda
        how = "CUDA-graph replay" if spec.cuda_graphs and device.startswith("cuda") else (
            "compiled forward" if spec.compile else "eager forward")
        self.timing = ("host launch-to-synchronize per batch: H2D copy of input ids from a "
                       f"pinned buffer, {how}, D2H copy of the output, stream synchronize; "
                       "gpu_ms from CUDA events around the forward")
        return runners

    def _open_onnxruntime(self, stack):
        ort = require("onnxruntime", "onnxruntime", "the onnxruntime backend")
        spec = self.spec
        provider = resolve_provider(spec.provider)
        info = _onnx_info(spec)
        path = converted_model(info, spec.precision, _cache_dir(spec) / "onnx")
        runners = [stack.enter_context(OrtRunner(info, path, provider=provider, seed=spec.seed + i))
                   for i in range(spec.instances)]
        self.backend_version = ort.__version__
        self.device = "cpu" if provider == "CPUExecutionProvider" else provider
        if provider == "CPUExecutionProvider":
            self.device = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"
        self.model_meta = self._onnx_meta(info)
        self.timing = (f"host time of one InferenceSession.run on {provider} (inputs from "
                       "host numpy arrays, output returned to the host)")
        return runners

    def _open_tensorrt(self, stack):
        spec = self.spec
        trt = t.import_tensorrt()
        t.import_cudart()
        info = _onnx_info(spec)
        settings = t.TrtSettings(precision=spec.precision, workspace_gib=spec.workspace_gib)
        shapes = t.profile_shapes(info.inputs, spec.batch_sizes, spec.seq_lens, settings.opt)
        gpu = _gpu_name()
        engine, built = t.build_engine(info, settings, shapes, _cache_dir(spec) / "trt", gpu,
                                       np.random.default_rng(spec.seed))
        runners = [stack.enter_context(t.TrtRunner(engine, info, shapes, cuda_graphs=spec.cuda_graphs,
                                                   seed=spec.seed + i))
                   for i in range(spec.instances)]
        self.backend_version = trt.__version__
        self.device = gpu
        self.model_meta = self._onnx_meta(info) | {
            "engine": engine.name, "engine_built_now": built, "trt_settings": asdict(settings)}
        self.timing = ("host launch-to-synchronize per batch: cudaMemcpyAsync H2D from pinned "
                       "memory, execute_async_v3 (or CUDA-graph launch), D2H copy, stream "
                       "synchronize; gpu_ms from CUDA events around the launch")
        return runners

    def _onnx_meta(self, info) -> dict:
        return {"model": f"{info.path.name} (ONNX opset {info.opset})",
                "model_source": self.spec.model, "model_sha256": info.sha256,
                "inputs": {s.name: [d if d is not None else "dynamic" for d in s.dims]
                           for s in info.inputs}}


def _gpu_name() -> str:
    rows = _csv_query("name")
    return rows[0]["name"] if rows else "unknown-gpu"


# -- the run -----------------------------------------------------------------------------

def run_profile(spec: ProfileSpec, out: str | os.PathLike, progress: Progress | None = None,
                command: str | None = None) -> Outcome:
    """Measure every cell of ``spec`` and write ``out`` (CSV, JSON sidecar, samples).

    On Ctrl-C or any error the cells already measured are written as a partial profile
    first; then the exception propagates (an out-of-memory batch becomes an InputError).
    """
    spec.check()
    progress = progress or Progress()
    out = Path(out)
    if out.suffix.lower() != ".csv":
        raise InputError(f"--out {out}: must name a .csv file (the sidecar and samples go next to it)")
    # Before the runners (and torch's and CUDA's threads, which inherit the CPU set) exist.
    pinning = pin_cpu(spec.cpu)
    command = command or shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    backend = _Backend(spec)
    results: dict = {}
    extras: dict = {"warmup_calls": {}, "truncated": []}
    gpu_before = gpu_state()
    started = datetime.now(timezone.utc)
    error: BaseException | None = None
    drift = dispatch = None
    runners = []
    with contextlib.ExitStack() as stack:
        try:
            runners = backend.open(stack)
            progress.start(spec.cells, spec)
            for i, (b, s) in enumerate(spec.cells):
                progress.cell_start(i, b, s)
                results[(b, s)] = _measure(runners, spec, b, s, progress, extras)
                progress.cell_done(i, b, s, _stats(results[(b, s)]))
            drift = _drift_check(runners, spec, results, progress)
            dispatch = _dispatch_gaps(runners[0], spec, progress)
            extras["power_cap"] = _power_cap(runners[0], spec, progress)
            extras["pair_slowdown"] = _pair_slowdown(runners, spec, progress)
            extras["host_variation"] = _host_variation(runners[0], spec, progress, results.get(spec.cells[0]))
        except BaseException as exc:  # noqa: BLE001 - keep the cells, then re-raise
            error = exc
    warnings = [w for r in runners for w in getattr(r, "warnings", [])] + backend.notes
    describe = runners[0].describe() if runners else {}
    if error is not None and not results:
        if is_out_of_memory(error):
            raise InputError(f"out of memory before any cell was measured "
                             f"({_first_line(error)})") from None
        if isinstance(error, InputError) and runners:
            raise InputError(f"{error} (no cell was measured, nothing written)") from None
        raise error
    outcome = _write(spec, out, results, extras, backend, describe, warnings, drift, dispatch,
                     gpu_before, started, command, error, pinning)
    if error is not None:
        if is_out_of_memory(error):
            cell = _next_cell(spec, results)
            raise InputError(f"device out of memory at batch={cell[0]} seq_len={cell[1]}: "
                             f"{_kept(outcome)}") from None
        if isinstance(error, InputError):
            raise InputError(f"{error} ({_kept(outcome)})") from None
        if isinstance(error, KeyboardInterrupt):
            raise Interrupted(outcome) from None
        error.add_note(f"schedsim profile: {_kept(outcome)}")
        raise error
    return outcome


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _kept(outcome: Outcome) -> str:
    if outcome.path is None:
        return "no complete batch row was measured, nothing written"
    return f"kept {outcome.cells} measured cells in {outcome.path} (marked partial)"


def _next_cell(spec: ProfileSpec, results: dict) -> tuple[int, int]:
    return next((c for c in spec.cells if c not in results), spec.cells[-1])


def _measure(runners, spec: ProfileSpec, b: int, s: int, progress: Progress, extras: dict):
    for r in runners:
        r.prepare(b, s)
    common = dict(warmup_s=spec.warmup_ms / 1e3, min_iters=spec.min_iters,
                  min_time_s=spec.min_time_s, max_time_s=spec.max_cell_s,
                  on_sample=progress.cell_sample)
    if len(runners) == 1:
        r = runners[0]
        res = sample_cell(lambda: r.infer(b, s), after=lambda: r.last_gpu_ms, **common)
    else:
        res = sample_concurrent([(lambda r=r: r.infer(b, s)) for r in runners],
                                after=[(lambda r=r: r.last_gpu_ms) for r in runners], **common)
    extras["warmup_calls"][f"{b}x{s}"] = res.warmup_calls
    if res.truncated:
        extras["truncated"].append(f"batch={b} seq_len={s}")
    return res


def _stats(res) -> dict:
    st = summarize(res.latency_ms)
    gpu = np.asarray(res.after, dtype=np.float64)
    gpu = gpu[np.isfinite(gpu)]
    if gpu.size:
        st["gpu_ms_mean"] = float(gpu.mean())
        st["gpu_ms_p50"] = float(np.median(gpu))
    return st


def _drift_check(runners, spec: ProfileSpec, results: dict, progress: Progress) -> dict | None:
    """Re-measure the first cell; report how far it moved since the start."""
    if not results:
        return None
    b, s = spec.cells[0]
    progress.note(f"drift check: re-measuring batch={b} seq_len={s}")
    again = _measure(runners, spec, b, s, Progress(), {"warmup_calls": {}, "truncated": []})
    first = float(np.median(results[(b, s)].latency_ms))
    last = float(np.median(again.latency_ms))
    return {"cell": {"batch": b, "seq_len": s}, "first_p50_ms": first, "last_p50_ms": last,
            "change": last / first - 1.0}


def _dispatch_gaps(runner, spec: ProfileSpec, progress: Progress) -> np.ndarray | None:
    """Host gap between one batch returning and the next being issued, in a serving loop.

    Between batches the loop does what a dynamic batcher does with requests that are
    already tokenized: pick the next ones and ``np.stack`` their id rows into the
    engine's staging buffer. Not part of any cell's latency.
    """
    if spec.dispatch_iters < 2 or not hasattr(runner, "host_input"):
        return None
    rng = np.random.default_rng(spec.seed + 1)
    s = spec.seq_lens[0]
    buf = runner.host_input(spec.batch_sizes[0], s)
    if buf.ndim != 2 or not np.issubdtype(buf.dtype, np.integer):
        return None
    progress.note(f"dispatch loop: {spec.dispatch_iters} batches at seq_len={s}")
    hi = int(buf.max()) + 1
    max_b = max(spec.batch_sizes)
    n_req = max(4 * max_b, 1024)
    requests = [rng.integers(0, hi, size=s).astype(buf.dtype) for _ in range(n_req)]
    sizes = rng.choice(np.asarray(spec.batch_sizes), size=spec.dispatch_iters).tolist()
    issue = np.empty(len(sizes), np.int64)
    done = np.empty(len(sizes), np.int64)
    clock = time.perf_counter_ns
    pos = 0
    for i, b in enumerate(sizes):
        out = runner.host_input(b, s)
        np.stack(requests[pos:pos + b], out=out)
        pos = (pos + b) % (n_req - max_b)
        issue[i] = clock()
        runner.infer(b, s)
        done[i] = clock()
    return (issue[1:] - done[:-1]) * 1e-3


POWER_CAP_MIN_SPREAD = 0.01
"""Write ``power_cap`` only when the steady factors span more than this (else the clock
did not move measurably, and its time constants cannot be fitted)."""


def _power_cap(runner, spec: ProfileSpec, progress: Progress) -> dict | None:
    """How a batch's time depends on the load just before it (a power-capped GPU lowers its
    clock under heavy batches; schedsim.cost.power).

    Phases of ``spec.power_cap_s`` seconds each, at the first seq_len: for five batch sizes
    from the smallest to the largest, back-to-back batches of that size with every 8th a
    probe of the middle size; the probe's median time (CUDA-event time where the runner
    records it) over its median in the probe size's own phase is that size's factor. Then
    a step from the probe size to the largest and on to the smallest, whose times give the
    clock's rise and fall time constants. The table was measured cell by cell, so its
    entries are "steady": each at its own size's factor.
    """
    if spec.power_cap_s <= 0:
        return None

    s = spec.seq_lens[0]
    sizes = sorted(spec.batch_sizes)
    probe = sizes[len(sizes) // 2]
    picks = sorted({sizes[round(q * (len(sizes) - 1))] for q in (0.0, 0.25, 0.5, 0.75, 1.0)} | {probe})
    progress.note(f"power cap: {len(picks) + 2} phases of {spec.power_cap_s:g} s at seq_len={s}")
    clock = time.perf_counter_ns

    def run_for(seconds: float, size_of) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Back-to-back batches for ``seconds`` (at least 16, so two probes): (start ns, size, ms) of each."""
        t, b, ms = [], [], []
        end = clock() + int(seconds * 1e9)
        i = 0
        while (t0 := clock()) < end or i < 16:
            n = size_of(i)
            runner.infer(n, s)
            dt = (clock() - t0) / 1e6
            g = runner.last_gpu_ms
            t.append(t0), b.append(n), ms.append(g if math.isfinite(g) else dt)
            i += 1
        return np.asarray(t), np.asarray(b), np.asarray(ms)

    for n in picks:
        runner.prepare(n, s)
    probe_ms = {}
    for n in picks:
        _, b, ms = run_for(spec.power_cap_s, lambda i, n=n: probe if i % 8 == 7 else n)
        probe_ms[n] = float(np.median(ms[b == probe]))
    factor = {n: probe_ms[n] / probe_ms[probe] for n in picks}
    lo, hi = picks[0], picks[-1]
    run_for(min(spec.power_cap_s, 0.5), lambda i: probe)

    def tau(size: int, start: float) -> float:
        t, _, ms = run_for(spec.power_cap_s, lambda i: size)
        return step_tau_ms((t - t[0]) / 1e6, ms / np.median(ms[len(ms) // 2:]), start)

    rise = tau(hi, factor[probe] / factor[hi])
    fall = tau(lo, factor[hi] / factor[lo])
    measured = {"batch": picks, "factor": [round(factor[n], 4) for n in picks], "table": "steady",
                "tau_rise_ms": rise, "tau_fall_ms": fall, "probe_batch": probe, "seq_len": s,
                "phase_s": spec.power_cap_s,
                "what": "batch time under back-to-back batches of each size (a probe of probe_batch every "
                        "8th) over its time under back-to-back probe_batch batches; time constants "
                        "from a step to the largest size and on to the smallest"}
    spread = max(factor.values()) - min(factor.values())
    return {"power_cap": measured} if spread > POWER_CAP_MIN_SPREAD else {"power_cap_measured": measured}


def _host_variation(runner, spec: ProfileSpec, progress: Progress, cell=None) -> dict | None:
    """How the host's speed moves between and within runs, on the smallest cell (5 rounds of
    ``spec.host_variation_s`` seconds): :func:`schedsim.profiling.host_variation.measure`,
    its timeline over the table's mean for that cell (``cell``, its measurement)."""
    if spec.host_variation_s <= 0:
        return None
    from schedsim.profiling.host_variation import measure, relative_to

    b, s = spec.cells[0]
    progress.note(f"host variation: 5 rounds of {spec.host_variation_s:g} s at batch={b} seq_len={s}")
    runner.prepare(b, s)
    record = measure(lambda: (runner.infer(b, s), None)[1], rounds=5, round_s=spec.host_variation_s,
                     window_s=min(0.25, spec.host_variation_s / 4), pause_s=min(0.5, spec.host_variation_s / 4),
                     what=f"one batch of {b} at seq_len {s}, wall time around the call")
    table_ms = _stats(cell)["latency_ms_mean"] if cell is not None and len(cell.latency_ms) else None
    return record if table_ms is None else relative_to(record, table_ms, f"the table's mean at batch {b}, seq_len {s}")


def pair_sizes(spec: ProfileSpec) -> list[int]:
    """The batch sizes of the pair-slowdown grid."""
    if spec.pair_batches:
        return sorted(set(spec.pair_batches))
    sizes = sorted(spec.batch_sizes)
    return sorted({b for b in sizes if b & (b - 1) == 0} | {sizes[0], sizes[-1]})


def _pair_slowdown(runners, spec: ProfileSpec, progress: Progress) -> dict | None:
    """How much a batch slows beside the other instance's batch of another size
    (:mod:`schedsim.core.contention`): each size alone on the first runner, then every pair of
    sizes on both runners at once, back to back, ``spec.pair_s`` seconds each, at the
    first seq_len. slowdown[i][j] is the median host latency of size i beside size j over
    its median alone; a pair (i, j) gives both [i][j] and [j][i]."""
    if spec.pair_s <= 0:
        return None
    s = spec.seq_lens[0]
    sizes = pair_sizes(spec)
    pairs = [(a, b) for i, a in enumerate(sizes) for b in sizes[i:]]
    progress.note(f"pair slowdown: {len(sizes)} sizes alone, {len(pairs)} pairs, {spec.pair_s:g} s each, "
                  f"seq_len={s}")
    one, two = runners[0], runners[1]
    for b in sizes:
        one.prepare(b, s)
        two.prepare(b, s)
    common = dict(warmup_s=min(spec.warmup_ms / 1e3, 0.1), min_iters=spec.min_iters,
                  min_time_s=spec.pair_s, max_time_s=spec.max_cell_s)
    alone = {b: float(np.median(sample_cell(lambda b=b: one.infer(b, s), **common).latency_ms))
             for b in sizes}
    index = {b: k for k, b in enumerate(sizes)}
    grid = [[math.nan] * len(sizes) for _ in sizes]
    for a, b in pairs:
        res = sample_concurrent([lambda: one.infer(a, s), lambda: two.infer(b, s)], **common)
        lat = np.asarray(res.latency_ms)
        if a == b:
            grid[index[a]][index[a]] = float(np.median(lat)) / alone[a]
        else:
            grid[index[a]][index[b]] = float(np.median(lat[res.instance == 0])) / alone[a]
            grid[index[b]][index[a]] = float(np.median(lat[res.instance == 1])) / alone[b]
    return {"batch": sizes, "slowdown": [[round(v, 4) for v in row] for row in grid], "seq_len": s,
            "pair_s": spec.pair_s, "alone_ms": [round(alone[b], 4) for b in sizes],
            "what": "slowdown[i][j]: median host latency of a batch of batch[i] beside back-to-back "
                    "batches of batch[j] on the other instance, over its median alone"}


def _write(spec, out, results, extras, backend, describe, warnings, drift, dispatch,
           gpu_before, started, command, error, pinning) -> Outcome:
    import pandas as pd  # lazy: pandas costs about 0.35 s of start-up

    complete = error is None and len(results) == len(spec.cells)
    done_batches = [b for b in spec.batch_sizes if all((b, s) in results for s in spec.seq_lens)]
    kept = [(b, s) for b in done_batches for s in spec.seq_lens]
    dropped = [c for c in results if c not in set(kept)]
    warnings = list(warnings)
    rows, samples = [], {}
    for b, s in kept:
        st = _stats(results[(b, s)])
        row = {"batch": b, "seq_len": s}
        row.update({k: v for k, v in st.items() if k.startswith(("latency_ms", "gpu_ms")) or k == "n"})
        rows.append(row)
        samples[(b, s)] = results[(b, s)].latency_ms
        if st["unstable"]:
            warnings.append(f"batch={b} seq_len={s} unstable: {st['unstable_reason']}")
    for cell in extras["truncated"]:
        warnings.append(f"{cell}: sampling stopped at --max-cell-s={spec.max_cell_s} before "
                        f"--min-iters/--min-time-s were met")
    if drift is not None and abs(drift["change"]) > DRIFT_WARN:
        warnings.append(f"drift: the first cell's p50 moved {drift['change']:+.1%} between the "
                        f"start and the end of the run (machine state changed?)")
    machine = machine_metadata(gpu_before, probe_torch=spec.backend == "torch") | {"cpu_pinning": pinning}
    warnings += machine["warnings"]
    if not complete:
        reason = "interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else (
            f"stopped by an error: {type(error).__name__}: {_first_line(error)}" if error else "")
        warnings.insert(0, f"PARTIAL PROFILE: {reason}; {len(kept)} of {len(spec.cells)} cells")
    missing = [c for c in spec.cells if c not in set(kept)]
    meta = {
        "schema": "schedsim.profile/1",
        "partial": not complete,
        **backend.model_meta,
        "backend": spec.backend,
        "backend_version": backend.backend_version,
        "precision": spec.precision,
        "cuda_graphs": bool(describe.get("cuda_graphs", spec.cuda_graphs)),
        "compile": spec.compile,
        "instances": spec.instances,
        "device": backend.device,
        "driver": machine.get("driver"),
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "command": command,
        "timing": backend.timing + (f"; {spec.instances} instances run each cell at once, one "
                                    "stream and thread each, and every call is a sample"
                                    if spec.instances > 1 else ""),
        "cell_order": "batch-major, each cell measured to completion before the next",
        "warmup_ms": spec.warmup_ms,
        "min_iters": spec.min_iters,
        "min_time_s": spec.min_time_s,
        "max_cell_s": spec.max_cell_s,
        "seed": spec.seed,
        "runner": describe,
        "drift_check": drift,
        "machine": machine,
        "warnings": warnings,
    }
    if dispatch is not None and dispatch.size:
        meta["dispatch_overhead_us"] = float(dispatch.mean())
        meta["dispatch_overhead"] = {
            "what": "host gap from one batch returning to the next being issued, with the "
                    "next batch's id rows np.stack-ed into the staging buffer in between",
            "n": int(dispatch.size), "p50_us": float(np.median(dispatch)),
            "p99_us": float(np.percentile(dispatch, 99)), "max_us": float(dispatch.max())}
    # The clock measurement: power_cap when the clock moved, else power_cap_measured (kept, unused).
    meta.update(extras.get("power_cap") or {})
    if extras.get("pair_slowdown"):
        meta["pair_slowdown"] = extras["pair_slowdown"]
    if extras.get("host_variation"):
        meta["host_variation"] = extras["host_variation"]
    if not complete:
        meta["missing_cells"] = [f"{b}x{s}" for b, s in missing]
        if dropped:
            meta["dropped_cells"] = {f"{b}x{s}": _stats(results[(b, s)]) for b, s in dropped}
    if not rows:
        return Outcome(None, False, 0, warnings, _first_line(error) if error else None)
    if spec.instances > 1:
        # Which instance took each sample, for analyses of fairness between instances.
        meta["instance_samples"] = {f"{b}x{s}": np.bincount(results[(b, s)].instance).tolist()
                                    for b, s in kept}
    df = pd.DataFrame(rows)
    save_profile(df, meta, out, samples)
    return Outcome(out, complete, len(rows), warnings, _first_line(error) if error else None)
