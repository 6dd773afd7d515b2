"""Timing helpers in the manner of pyperf and trtexec: warm-up, interleaved samples, spread.

Each *cell* (for example one batch size) is a callable that does one unit of work and
returns only once that work is finished (it synchronizes with the device), so the host
clock around the call measures launch-to-synchronize latency. Cells are warmed up for a
fixed time, then sampled in rounds; each round visits every cell in a fresh random order
and takes a few samples from each, so slow drift (clocks, temperature, other tenants)
spreads over all cells instead of biasing whichever ran last.

Results report their own trustworthiness: :func:`summarize` flags a cell as unstable
when its spread is wide, and :func:`machine_metadata` stamps the machine and GPU state
(with a warning when the GPU looks shared or throttled). This module imports only the
standard library and numpy; torch is imported lazily, and only to describe the machine.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

# pyperf warns when the standard deviation exceeds 10% of the mean: beyond that, a
# difference of a few percent between two runs cannot be told from noise.
UNSTABLE_STD_OVER_MEAN = 0.10
# A slowest sample more than twice the fastest means at least one sample was hit by
# something other than the work (preemption, clock change, another tenant).
UNSTABLE_MAX_OVER_MIN = 2.0

# Bits of nvidia-smi's clocks_throttle_reasons.active that do not mean a slowdown:
# 0x1 GPU idle, 0x2 application clocks setting.
_BENIGN_THROTTLE_BITS = 0x1 | 0x2


def summarize(samples_ms) -> dict:
    """Summary statistics of latency samples in ms, with a pyperf-like ``unstable`` flag.

    Keys: n, latency_ms_{mean,p50,p90,p99,std,min,max}, unstable (bool) and
    unstable_reason (str, empty when stable). ``std`` is the sample standard deviation
    (ddof=1); percentiles use numpy's default linear interpolation.
    """
    x = np.asarray(samples_ms, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("summarize() needs at least one sample, got none")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    p50, p90, p99 = (float(v) for v in np.percentile(x, [50, 90, 99]))
    lo, hi = float(x.min()), float(x.max())
    reasons = []
    if mean > 0 and std / mean > UNSTABLE_STD_OVER_MEAN:
        reasons.append(f"std/mean = {std / mean:.3f} > {UNSTABLE_STD_OVER_MEAN}")
    if lo > 0 and hi / lo > UNSTABLE_MAX_OVER_MIN:
        reasons.append(f"max/min = {hi / lo:.2f} > {UNSTABLE_MAX_OVER_MIN}")
    return {
        "n": int(x.size),
        "latency_ms_mean": mean,
        "latency_ms_p50": p50,
        "latency_ms_p90": p90,
        "latency_ms_p99": p99,
        "latency_ms_std": std,
        "latency_ms_min": lo,
        "latency_ms_max": hi,
        "unstable": bool(reasons),
        "unstable_reason": "; ".join(reasons),
    }


def time_call_ms(fn: Callable[[], object]) -> float:
    """Host time of one call in ms (``perf_counter_ns``; ``fn`` must synchronize itself)."""
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) * 1e-6


def warm_up(fn: Callable[[], object], seconds: float) -> int:
    """Call ``fn`` repeatedly for at least ``seconds`` (and at least once); return the count."""
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    calls = 0
    while True:
        fn()
        calls += 1
        if time.perf_counter_ns() >= deadline:
            return calls


@dataclass
class Interleaved:
    """Raw samples from :func:`interleaved`, in measurement order."""

    order: list = field(default_factory=list)
    """Cell key of each sample, in measurement order."""
    latency_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Host latency of each sample in ms, aligned with ``order``."""
    rounds: int = 0
    """Rounds run (each visits every cell once)."""
    truncated: bool = False
    """True when ``max_time_s`` stopped the run before its targets were met."""
    warmup_calls: dict = field(default_factory=dict)
    """Warm-up calls made per cell."""

    def samples(self, key: Hashable) -> np.ndarray:
        """The samples of one cell, in measurement order."""
        keys = np.empty(len(self.order), dtype=object)
        keys[:] = self.order
        return self.latency_ms[keys == key] if len(self.order) else np.empty(0)

    def by_cell(self) -> dict:
        """Mapping cell key -> its samples (ms), in measurement order."""
        out: dict = {}
        for k, v in zip(self.order, self.latency_ms):
            out.setdefault(k, []).append(v)
        return {k: np.asarray(v) for k, v in out.items()}


def interleaved(cells: Mapping[Hashable, Callable[[], object]], rng: np.random.Generator, *,
                warmup_s: float = 0.2, min_iters: int = 200, min_time_s: float = 0.5,
                per_visit: int = 4, max_time_s: float | None = None,
                after: Callable[[Hashable], None] | None = None) -> Interleaved:
    """Warm up every cell, then sample them in seeded random rounds until the targets hold.

    Targets: every cell has at least ``min_iters`` samples, and the timed calls add up to
    at least ``min_time_s`` per cell on average. Each round visits every cell once, in an
    order drawn from ``rng``, taking ``per_visit`` back-to-back samples. ``after(key)``,
    if given, is called after each timed sample, outside the timed region (to read CUDA
    events, say). ``max_time_s`` bounds the sampling phase's wall time; when it ends
    the run early the result says ``truncated``.
    """
    if not cells:
        raise ValueError("interleaved() needs at least one cell, got none")
    if min_iters < 1 or per_visit < 1:
        raise ValueError(f"min_iters={min_iters} and per_visit={per_visit} must be >= 1")
    keys = list(cells)
    res = Interleaved()
    # Warm-up in a random order too, so no cell is systematically the coldest.
    for i in rng.permutation(len(keys)):
        res.warmup_calls[keys[i]] = warm_up(cells[keys[i]], warmup_s)
    counts = dict.fromkeys(keys, 0)
    timed_ns = 0
    target_ns = int(min_time_s * len(keys) * 1e9)
    start = time.perf_counter_ns()
    deadline = None if max_time_s is None else start + int(max_time_s * 1e9)
    samples_ns: list[int] = []
    clock = time.perf_counter_ns
    while min(counts.values()) < min_iters or timed_ns < target_ns:
        if deadline is not None and clock() >= deadline:
            res.truncated = True
            break
        for i in rng.permutation(len(keys)):
            key, fn = keys[i], cells[keys[i]]
            for _ in range(per_visit):
                t0 = clock()
                fn()
                dt = clock() - t0
                samples_ns.append(dt)
                res.order.append(key)
                timed_ns += dt
                if after is not None:
                    after(key)
            counts[key] += per_visit
        res.rounds += 1
    res.latency_ms = np.asarray(samples_ns, dtype=np.float64) * 1e-6
    return res


# -- machine metadata ---------------------------------------------------------------------

_GPU_QUERY = "clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu"


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    """stdout of a command, or None if it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def _csv_query(fields: str) -> list[dict] | None:
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"])
    if not out:
        return None
    names = fields.split(",")
    return [dict(zip(names, (v.strip() for v in line.split(",")))) for line in out.splitlines()]


def gpu_state() -> list[dict] | None:
    """One dict per GPU of ``nvidia-smi --query-gpu=clocks.sm,clocks.mem,...``; None if unavailable."""
    rows = _csv_query(_GPU_QUERY)
    if rows is None:
        return None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for r in rows:
        r["time"] = stamp
    return rows


# What a sampler records: nvidia-smi's own wall-clock stamp, then the state that moves a
# batch's time (clock, power against the cap, temperature, throttle reasons).
GPU_SAMPLE_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


class gpu_sampler:
    """``nvidia-smi`` every ``interval_ms`` into ``path`` (CSV, no header) while the block runs.

    Does nothing where nvidia-smi is missing. ``self.started`` records the epoch and the
    local UTC offset at start, so samples (stamped in the device's local time) can be put
    on the same clock as a run's ``time.time()`` marks.
    """

    def __init__(self, path, interval_ms: int = 20):
        self.path, self.interval_ms = path, int(interval_ms)
        self.proc = None
        self.started: dict = {}

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self.started = {"epoch_s": time.time(), "utc_offset": time.strftime("%z"),
                            "interval_ms": self.interval_ms, "fields": GPU_SAMPLE_FIELDS}
            with open(self.path, "w") as out:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={GPU_SAMPLE_FIELDS}", "--format=csv,noheader,nounits",
                     "-lms", str(self.interval_ms)],
                    stdout=out, stderr=subprocess.DEVNULL)
        return self

    def avoid(self, cpus) -> None:
        """Keep the sampler off ``cpus`` (a run's pinned CPUs), where it would steal host time."""
        if self.proc and hasattr(os, "sched_setaffinity"):
            rest = set(range(os.cpu_count() or 1)) - set(cpus)
            if rest:
                try:
                    os.sched_setaffinity(self.proc.pid, rest)
                except OSError:
                    pass  # the sampler has exited or the set is not allowed: leave it

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
        return False


def _gpu_warnings() -> list[str]:
    """Best-effort signs that the GPU is shared or throttled."""
    warnings = []
    apps = _run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                 "--format=csv,noheader"])
    if apps:
        # Our own process is listed once it has a CUDA context; others mean sharing.
        others = [ln for ln in apps.splitlines()
                  if ln.split(",")[0].strip() != str(os.getpid())]
        if others:
            warnings.append("shared_or_throttled: other GPU processes visible: "
                            + " | ".join(others))
    for field_name in ("clocks_throttle_reasons.active", "clocks_event_reasons.active"):
        rows = _csv_query(field_name)
        if rows is None:
            continue
        for i, r in enumerate(rows):
            try:
                bits = int(r[field_name], 16)
            except ValueError:
                continue
            if bits & ~_BENIGN_THROTTLE_BITS:
                warnings.append(f"shared_or_throttled: GPU {i} clock throttle reasons "
                                f"active: {r[field_name]}")
        break
    return warnings


def machine_metadata(gpu_before: list[dict] | None = None, *, probe_torch: bool = True) -> dict:
    """Describe the machine and GPU for a result's provenance; never raises.

    Includes hostname, platform, python and numpy versions; when torch with CUDA is
    importable (and ``probe_torch``), the GPU name, CUDA and torch versions; the driver
    from nvidia-smi; GPU clocks/temperature/power now (``gpu_after``) and, if passed,
    from before the run (``gpu_before``); and ``warnings``, a list that holds
    ``shared_or_throttled`` messages when other GPU processes are visible or clock
    throttle reasons are active.
    """
    meta: dict = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "warnings": [],
    }
    try:
        if probe_torch:
            import torch  # lazy: torch is an optional dependency

            meta["torch"] = torch.__version__
            if torch.cuda.is_available():
                meta["gpu"] = torch.cuda.get_device_name()
                meta["cuda"] = torch.version.cuda
                props = torch.cuda.get_device_properties(0)
                meta["gpu_multiprocessors"] = props.multi_processor_count
                meta["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:  # noqa: BLE001 - metadata must never fail the run
        meta["warnings"].append(f"torch not usable for metadata: {exc!r}")
    try:
        drv = _csv_query("driver_version,name")
        if drv:
            meta["driver"] = drv[0]["driver_version"]
            meta.setdefault("gpu", drv[0]["name"])
        if gpu_before is not None:
            meta["gpu_before"] = gpu_before
        after = gpu_state()
        if after is not None:
            meta["gpu_after"] = after
        meta["warnings"].extend(_gpu_warnings())
    except Exception as exc:  # noqa: BLE001
        meta["warnings"].append(f"nvidia-smi query failed: {exc!r}")
    return meta


# -- one cell at a time (the profiler) ----------------------------------------------------

@dataclass
class CellSamples:
    """Raw samples of one cell from :func:`sample_cell` or :func:`sample_concurrent`."""

    latency_ms: np.ndarray
    """Host latency of each timed call in ms, in measurement order (all instances pooled)."""
    after: list = field(default_factory=list)
    """What ``after()`` returned after each timed call (GPU event times, say), aligned."""
    instance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """Which instance (thread) took each sample; all 0 for :func:`sample_cell`."""
    warmup_calls: int = 0
    """Warm-up calls made (summed over instances)."""
    truncated: bool = False
    """True when ``max_time_s`` ended sampling before ``min_iters`` and ``min_time_s`` held."""


def _targets_met(n: int, timed_ns: int, min_iters: int, min_time_s: float) -> bool:
    return n >= min_iters and timed_ns >= min_time_s * 1e9


def sample_cell(fn: Callable[[], object], *, warmup_s: float, min_iters: int, min_time_s: float,
                max_time_s: float | None = None, min_samples: int = 10,
                after: Callable[[], object] | None = None,
                on_sample: Callable[[int], None] | None = None) -> CellSamples:
    """Warm up ``fn``, then time it until it has ``min_iters`` samples and ``min_time_s`` of them.

    trtexec's rule (warm-up time, then at least N iterations and T seconds). ``max_time_s``
    caps the sampling phase once ``min(min_samples, min_iters)`` samples exist, and the
    result then says ``truncated``. ``after()`` runs after each timed call, outside the
    timed region; ``on_sample(n)`` too (a progress bar).
    """
    if min_iters < 1:
        raise ValueError(f"min_iters={min_iters} must be >= 1")
    warm = warm_up(fn, warmup_s)
    clock = time.perf_counter_ns
    lat, extra = [], []
    timed = 0
    floor = min(min_samples, min_iters)
    start = clock()
    truncated = False
    while True:
        t0 = clock()
        fn()
        dt = clock() - t0
        lat.append(dt)
        timed += dt
        if after is not None:
            extra.append(after())
        if on_sample is not None:
            on_sample(len(lat))
        if _targets_met(len(lat), timed, min_iters, min_time_s):
            break
        if max_time_s is not None and len(lat) >= floor and clock() - start >= max_time_s * 1e9:
            truncated = True
            break
    return CellSamples(np.asarray(lat, np.float64) * 1e-6, extra,
                       np.zeros(len(lat), np.int32), warm, truncated)


def sample_concurrent(fns: list[Callable[[], object]], *, warmup_s: float, min_iters: int,
                      min_time_s: float, max_time_s: float | None = None, min_samples: int = 10,
                      after: list[Callable[[], object]] | None = None,
                      on_sample: Callable[[int], None] | None = None) -> CellSamples:
    """Run K callables at once, one thread each, and time every call under that contention.

    Models K engine instances on one device (Triton's ``instance_group { count: K }``): each
    thread warms up, all start sampling together (a barrier), and all keep calling until
    every thread has ``min_iters`` samples and ``min_time_s`` of timed calls (or
    ``max_time_s`` passed), so no sample is taken while a sibling is idle, except the
    last call of each thread. Samples of all threads are pooled; ``instance`` says whose.
    An exception in any thread stops all and is re-raised here.
    """
    k = len(fns)
    if k < 1:
        raise ValueError("sample_concurrent() needs at least one callable")
    after = after or [None] * k
    lat: list[list[int]] = [[] for _ in range(k)]
    extra: list[list] = [[] for _ in range(k)]
    timed = [0] * k
    warm = [0] * k
    errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(k + 1)
    clock = time.perf_counter_ns

    def work(i: int) -> None:
        try:
            warm[i] = warm_up(fns[i], warmup_s)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
            stop.set()
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while not stop.is_set():
                t0 = clock()
                fns[i]()
                dt = clock() - t0
                lat[i].append(dt)
                timed[i] += dt
                if after[i] is not None:
                    extra[i].append(after[i]())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    truncated = False
    try:
        barrier.wait()
        start = clock()
        floor = min(min_samples, min_iters)
        while not stop.is_set():
            time.sleep(0.001)
            n = min(len(x) for x in lat)
            if on_sample is not None:
                on_sample(n)
            if all(_targets_met(len(lat[i]), timed[i], min_iters, min_time_s) for i in range(k)):
                break
            if max_time_s is not None and n >= floor and clock() - start >= max_time_s * 1e9:
                truncated = True
                break
    except threading.BrokenBarrierError:
        pass
    finally:
        stop.set()
        barrier.abort()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    inst = np.concatenate([np.full(len(x), i, np.int32) for i, x in enumerate(lat)])
    return CellSamples(np.concatenate([np.asarray(x, np.float64) for x in lat]) * 1e-6,
                       [v for x in extra for v in x], inst, sum(warm), truncated)
