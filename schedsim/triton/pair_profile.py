"""Two Triton model instances on one GPU: the pair-slowdown grid, measured through the server.

With ``instance_group { count: 2 }`` each instance of a Python-backend model is a process
of its own with its own CUDA context, and the GPU interleaves the two instances' batches.
How much a batch slows depends on both sizes (:mod:`schedsim.core.contention`), so the
simulator needs the grid ``slowdown[a][b]``: a batch of ``a`` beside back-to-back batches
of ``b``, over its time alone.

Two one-instance models on one server are two such processes; so for each pair of sizes
``a <= b`` the profiler drives ``profile_b{a}`` and ``profile_b{b}`` (for ``a == b``, the
twin ``pair_b{b}``) closed loop at the same time, each with full batches back to back,
and reads both models' statistics twice while both are busy: the compute per execution
between the two reads, over that size's compute alone (the busy table), is the slowdown
of each side. Grouped per pair, both directions come from one stretch.
"""

from __future__ import annotations

import math
import threading
import time

from schedsim.errors import InputError

LEAD_S = 0.3
"""Time both sides run before the first statistics read (both queues full)."""


def twin_name(b: int) -> str:
    return f"pair_b{b}"


def default_pair_sizes(batch_sizes) -> tuple:
    """1, 8, 32 and the largest measured size (those of them measured): the corners and the
    middle of the grid, which the contention model interpolates."""
    sizes = sorted(set(batch_sizes))
    keep = {s for s in (1, 8, 32) if s in sizes} | {sizes[-1]}
    return tuple(sorted(keep))


def measure_pair_grid(server, spec, results: dict, sizes, drive, model_name, note=print,
                      pair_s: float = 1.0) -> dict:
    """The sidecar's ``pair_slowdown`` for ``sizes`` (all measured alone in ``results``).

    ``drive(model, clients, requests, seed)`` drives one model closed loop (blocking);
    ``model_name(b)`` names the one-instance model of size ``b``."""
    from schedsim.triton.stats import snapshot

    sizes = sorted(sizes)
    missing = [b for b in sizes if b not in results]
    if missing:
        raise InputError(f"--pair-batches: {missing} were not measured alone (add them to --batch-sizes)")
    index = {b: i for i, b in enumerate(sizes)}
    grid = [[math.nan] * len(sizes) for _ in sizes]
    runs = []
    for i, a in enumerate(sizes):
        for b in sizes[i:]:
            sides = [(a, model_name(a)), (b, model_name(b) if b != a else twin_name(b))]
            per_exec = _pair_stretch(server.url, sides, results, spec.depth, drive, snapshot, pair_s)
            sa, sb = (per_exec[k] / results[size].mean_ms for k, (size, _) in enumerate(sides))
            grid[index[a]][index[b]] = round(sa, 4)
            grid[index[b]][index[a]] = round(sb, 4)
            runs.append({"a": a, "b": b, "a_ms": round(per_exec[0], 6), "b_ms": round(per_exec[1], 6)})
            note(f"pair {a:>3} + {b:<3}: slowdown {sa:.2f} / {sb:.2f}")
    return {"batch": sizes, "slowdown": grid, "seq_len": spec.seq_len, "pair_s": pair_s, "runs": runs,
            "method": ("two one-instance models (two Python-backend processes on the GPU) driven closed loop at "
                       "once with full batches; compute per execution from Triton's batch_stats between two reads "
                       f"{pair_s:g} s apart while both are busy, over the size's compute alone")}


def _pair_stretch(url, sides, results, depth, drive, snapshot, pair_s) -> list[float]:
    """Mean compute per execution (ms) of each side while both run."""
    threads, errors = [], []
    for k, (b, model) in enumerate(sides):
        # Enough requests that both sides are still busy at the second read, with margin.
        batches = math.ceil(3.0 * (LEAD_S + pair_s) / max(results[b].cycle_ms / 1e3, 1e-5)) + 4 * depth
        args = (model, depth * b, batches * b, 1000 + k)
        threads.append(threading.Thread(target=_guard, args=(drive, args, errors), daemon=True))
    for t in threads:
        t.start()
    time.sleep(LEAD_S)
    before = [snapshot(url, model) for _, model in sides]
    time.sleep(pair_s)
    after = [snapshot(url, model) for _, model in sides]
    busy = all(t.is_alive() for t in threads)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if not busy:
        raise InputError(f"pair {sides[0][0]} + {sides[1][0]}: one side finished before the second statistics "
                         "read; the stretch is not concurrent")
    out = []
    for (b, model), now, then in zip(sides, after, before):
        d = now.since(then, f"{url} statistics")
        if d.executions(b) == 0:
            raise InputError(f"pair {sides[0][0]} + {sides[1][0]}: {model} ran no batch of {b} between the reads")
        out.append(sum(d.batch_mean_ns(b).values()) / 1e6)
    return out


def _guard(drive, args, errors) -> None:
    try:
        drive(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread
        errors.append(exc)
