"""How the host's speed moves between and within runs: the ``host_variation`` record of a
profile's sidecar, read by the prediction band (:mod:`schedsim.run.bands`).

Method. One fixed call (the engine's smallest measured batch, as ``schedsim profile
--host-variation-s S`` runs it; or any callable) is timed back to back in ``rounds`` rounds
of ``round_s`` seconds, with a pause of ``pause_s`` between rounds (the host's other work
and the kernel's CPU placement move in between). Within a round the calls are grouped into
windows of ``window_s`` by start time and each window gives its median.

- ``between_runs_cv``: the standard deviation of the rounds' medians over their mean: how
  far one run's overall speed sits from another's.
- ``within_run_cv``: the standard deviation of the window medians, each over its own
  round's median, pooled over rounds: how far the speed moves during one run, on the
  ``window_s`` scale. A run spanning T seconds averages about T / window_s such windows, so
  the band scales this variance by ``window_s / T`` (see :func:`schedsim.run.bands.host_sigma`).

The figures are ratios, so they apply to every service time of the table: the band runs
each replication on the table times one log-normal factor. What one profiling process
cannot see is how a different machine, or the same one on another day, differs: the
rounds share one process and one boot. Records of several machines combine with
:func:`combine` (their rounds' medians pooled), which is the between-machines figure.
Medians, not means, so that one descheduled call does not move a window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from schedsim.errors import InputError

METHOD = ("one fixed call timed back to back in ROUNDS rounds of ROUND_S s with PAUSE_S s between; "
          "between_runs_cv = std/mean of the rounds' medians; within_run_cv = std of the "
          "WINDOW_S-second window medians over their round's median, pooled over rounds")


def measure(call: Callable[[], float | None], *, rounds: int = 5, round_s: float = 2.0, window_s: float = 0.25,
            pause_s: float = 0.5, clock: Callable[[], float] = time.perf_counter,
            sleep: Callable[[float], None] = time.sleep, what: str = "") -> dict:
    """The ``host_variation`` record of ``call`` (see the module docstring). ``call``
    returns its own duration in seconds (a CUDA-event time, say) or None to be timed by
    ``clock`` around it."""
    if rounds < 2:
        raise InputError(f"host variation: rounds {rounds} is not valid; expected an integer >= 2")
    if not (round_s > 0 and window_s > 0 and pause_s >= 0) or window_s > round_s:
        raise InputError(f"host variation: round_s {round_s}, window_s {window_s}, pause_s {pause_s}: "
                         "expected round_s > 0, 0 < window_s <= round_s, pause_s >= 0")
    samples = []
    for r in range(rounds):
        if r:
            sleep(pause_s)
        start, starts, durations = clock(), [], []
        while (t0 := clock()) - start < round_s:
            took = call()
            durations.append(float(took) if took is not None else clock() - t0)
            starts.append(t0 - start)
        samples.append((np.asarray(starts), np.asarray(durations)))
    return summarise(samples, window_s, round_s=round_s, pause_s=pause_s, what=what)


def summarise(samples: list[tuple[np.ndarray, np.ndarray]], window_s: float, *, round_s: float | None = None,
              pause_s: float | None = None, what: str = "") -> dict:
    """The record from each round's (start offsets s, durations s) arrays."""
    medians, ratios, windows = [], [], 0
    for starts, durations in samples:
        if durations.size == 0:
            continue
        m = float(np.median(durations))
        medians.append(m)
        idx = np.floor(starts / window_s).astype(np.int64)
        for w in np.unique(idx):
            ratios.append(float(np.median(durations[idx == w])) / m)
            windows += 1
    if len(medians) < 2:
        raise InputError("host variation: fewer than two rounds timed a call; nothing to compare")
    med = np.asarray(medians)
    record = {
        "between_runs_cv": float(med.std(ddof=1) / med.mean()),
        "within_run_cv": float(np.std(ratios, ddof=1)) if len(ratios) > 1 else 0.0,
        "window_s": float(window_s),
        "rounds": len(medians),
        "windows": windows,
        "calls": int(sum(d.size for _, d in samples)),
        "round_medians_ms": [round(v * 1e3, 6) for v in medians],
        "window_ratio_range": [float(min(ratios)), float(max(ratios))],
        "scope": "one profiling process: rounds on the same machine and boot",
        "method": METHOD.replace("ROUNDS", str(len(medians))).replace("ROUND_S", f"{round_s:g}" if round_s else "?")
                        .replace("PAUSE_S", f"{pause_s:g}" if pause_s is not None else "?")
                        .replace("WINDOW_S", f"{window_s:g}"),
    }
    if what:
        record["call"] = what
    if len(medians) < 3:
        record["warning"] = "two rounds give a rough between-runs figure; measure 5 or more"
    return record


def combine(records: list[dict]) -> dict:
    """One record from several of the same call (other machines, other days): between-runs
    from all their rounds' medians together; within-run the root mean square."""
    if not records:
        raise InputError("host variation: no records to combine")
    med = np.asarray([m for rec in records for m in rec["round_medians_ms"]], dtype=float)
    windows = sorted({float(r["window_s"]) for r in records})
    if len(windows) > 1:
        raise InputError(f"host variation: records measured with different window_s ({windows}); "
                         "combine records of one window length")
    within = math.sqrt(float(np.mean([r["within_run_cv"] ** 2 for r in records])))
    return {"between_runs_cv": float(med.std(ddof=1) / med.mean()), "within_run_cv": within, "window_s": windows[0],
            "rounds": int(med.size), "windows": int(sum(r.get("windows", 0) for r in records)),
            "round_medians_ms": [m for r in records for m in r["round_medians_ms"]],
            "scope": f"{len(records)} records combined (machines or sessions)",
            "method": "combine(): between_runs_cv = std/mean of every record's round medians together; "
                      "within_run_cv = root mean square of the records'"}
