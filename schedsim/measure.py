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
