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
- The timeline, from **means**: ``round_factors`` (each round's mean call time over
  ``reference_ms``: the table's own mean for the call, :func:`relative_to`, as ``schedsim
  profile`` records it; else the rounds' mean)
  and ``window_factors`` (per round, each window's mean call time over its round's mean,
  in time order), with their spreads ``between_runs_cv_mean`` and ``within_run_cv_mean``. A queue feels the mean: a call descheduled for 20 ms holds every
  request behind it, and slow spells come in runs of windows, which a median and a
  variance shrunk by the window count both leave out. The band replays the measured window
  sequences (:class:`schedsim.run.bands.HostTimeline`) when the record has them.

The figures are ratios, so they apply to every service time of the table: the band runs
each replication on the table times one log-normal factor. What one profiling process
cannot see is how a different machine, or the same one on another day, differs: the
rounds share one process and one boot. Records of several machines combine with
:func:`combine` (their rounds' medians pooled), which is the between-machines figure.
The median figures are kept for what they say about the engine's own speed; the mean
figures are what the band uses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from schedsim.errors import InputError

METHOD = ("one fixed call timed back to back in ROUNDS rounds of ROUND_S s with PAUSE_S s between; "
          "between_runs_cv = std/mean of the rounds' medians; within_run_cv = std of the "
          "WINDOW_S-second window medians over their round's median, pooled over rounds; the timeline "
          "(round_factors, window_factors and their *_cv_mean) the same with means")


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
        samples.append(time_round(call, round_s, clock))
    return summarise(samples, window_s, round_s=round_s, pause_s=pause_s, what=what)


def time_round(call: Callable[[], float | None], round_s: float,
               clock: Callable[[], float] = time.perf_counter) -> tuple[np.ndarray, np.ndarray]:
    """One round: ``call`` back to back for ``round_s``; (start offsets s, durations s)."""
    start, starts, durations = clock(), [], []
    while (t0 := clock()) - start < round_s:
        took = call()
        durations.append(float(took) if took is not None else clock() - t0)
        starts.append(t0 - start)
    return np.asarray(starts), np.asarray(durations)


def summarise(samples: list[tuple[np.ndarray, np.ndarray]], window_s: float, *, round_s: float | None = None,
              pause_s: float | None = None, what: str = "") -> dict:
    """The record from each round's (start offsets s, durations s) arrays."""
    medians, ratios, windows = [], [], 0
    means, mean_windows = [], []
    for starts, durations in samples:
        if durations.size == 0:
            continue
        m = float(np.median(durations))
        medians.append(m)
        mu = float(durations.mean())
        means.append(mu)
        idx = np.floor(starts / window_s).astype(np.int64)
        mean_windows.append([])
        for w in np.unique(idx):
            ratios.append(float(np.median(durations[idx == w])) / m)
            mean_windows[-1].append(float(durations[idx == w].mean()) / mu)
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
        "between_runs_cv_mean": float(np.std(means, ddof=1) / np.mean(means)),
        "within_run_cv_mean": float(np.std([v for r in mean_windows for v in r], ddof=1)) if windows > 1 else 0.0,
        "round_means_ms": [round(v * 1e3, 6) for v in means],
        "reference_ms": round(float(np.mean(means)) * 1e3, 6),
        "round_factors": [round(v / float(np.mean(means)), 5) for v in means],
        "window_factors": [[round(v, 5) for v in r] for r in mean_windows],
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


def from_batches(runs: list[tuple[np.ndarray, np.ndarray]], window_s: float = 0.25, what: str = "") -> dict:
    """The record from served batches instead of a loop of one call: per live run, each
    batch's start (s) and its engine time over the cost table's mean for its size. Each run
    is a round, so ``round_factors`` are the runs' mean slowdowns against the table and
    ``window_factors`` how they moved within each run; the times are in table units (1 ms =
    the table's time), so ``reference_ms`` is 1. What the serving loop itself met: the
    batches lose the CPU as the loop does, busy or waking, which a loop of one call does not
    reproduce (a call after an idle gap is descheduled far less often than one of a busy loop)."""
    samples = [(np.asarray(t, dtype=float) - float(np.min(t)), np.asarray(r, dtype=float) * 1e-3)
               for t, r in runs if np.size(t)]
    record = summarise(samples, window_s, what=what or "each live batch's engine time over the table's mean for its size")
    record["method"] = ("from_batches(): each live run a round, each batch's engine time over the table's mean for "
                        f"its size; between_runs_cv and the timeline from the runs' and the {window_s:g}-second "
                        "windows' means and medians as in measure()")
    return relative_to(record, 1.0, "the cost table (times in table units)")


def relative_to(record: dict, reference_ms: float, what: str) -> dict:
    """``record`` with its timeline's rounds over ``reference_ms``: the cost table's own mean
    for the timed call, measured the same way (``what`` says which), so that a round factor
    is how much slower than the table the host ran. Without it the rounds' own mean is the
    reference, and a table measured in a busier or quieter minute than the rounds is off by
    the difference."""
    if not (isinstance(reference_ms, (int, float)) and math.isfinite(reference_ms) and reference_ms > 0):
        raise InputError(f"host variation: reference {reference_ms!r} ms is not valid; expected a positive number")
    if "round_means_ms" not in record:
        return record
    means = np.asarray(record["round_means_ms"], dtype=float)
    return record | {"reference_ms": float(reference_ms), "reference": what,
                     "round_factors": (means / reference_ms).round(5).tolist()}


def combine(records: list[dict]) -> dict:
    """One record from several of the same call (other machines, other days): between-runs
    from all their rounds' medians together; within-run the root mean square. The
    timeline pools every record's rounds, each round's factor over the **first** record's
    ``reference_ms``: put the profile's own record first, so that the band is relative to
    the host the table was measured on."""
    if not records:
        raise InputError("host variation: no records to combine")
    med = np.asarray([m for rec in records for m in rec["round_medians_ms"]], dtype=float)
    windows = sorted({float(r["window_s"]) for r in records})
    if len(windows) > 1:
        raise InputError(f"host variation: records measured with different window_s ({windows}); "
                         "combine records of one window length")
    within = math.sqrt(float(np.mean([r["within_run_cv"] ** 2 for r in records])))
    out = {"between_runs_cv": float(med.std(ddof=1) / med.mean()), "within_run_cv": within, "window_s": windows[0],
           "rounds": int(med.size), "windows": int(sum(r.get("windows", 0) for r in records)),
           "round_medians_ms": [m for r in records for m in r["round_medians_ms"]],
           "scope": f"{len(records)} records combined (machines or times)",
           "method": "combine(): between_runs_cv = std/mean of every record's round medians together; "
                     "within_run_cv = root mean square of the records'; the timeline's rounds pooled"}
    if all("round_means_ms" in r and "window_factors" in r for r in records):
        means = np.asarray([m for r in records for m in r["round_means_ms"]], dtype=float)
        factors = [w for r in records for w in r["window_factors"]]
        reference = float(records[0].get("reference_ms") or np.mean(records[0]["round_means_ms"]))
        if records[0].get("reference"):
            out["reference"] = records[0]["reference"]
        out |= {"between_runs_cv_mean": float(means.std(ddof=1) / means.mean()),
                "within_run_cv_mean": float(np.std([v for w in factors for v in w], ddof=1)),
                "round_means_ms": means.tolist(), "reference_ms": reference,
                "round_factors": (means / reference).round(5).tolist(), "window_factors": factors}
    return out
