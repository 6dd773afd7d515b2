"""Pin a measuring process to the fastest CPU (or CPUs), as pyperf's ``--affinity`` does.

Why: on the H200 machines here (KVM guests with 16 vCPUs) one vCPU runs a pure-Python
loop in 1.0-1.2 ms or in 1.5-2.0 ms, depending on what else its physical core is doing,
and the kernel moves an unpinned process between them every few seconds. Host-bound work
(an eager LLM step launches hundreds of kernels from Python; a request-level batch's
dispatch) then switches between two speeds mid-run: an eager step took 14-17 ms or
21-29 ms (1-second medians), while the GPU's own work held within 1%
(experiments/fidelity-llm/drift/, experiments/fidelity/calibration/host_cpus/).
Pinned to one vCPU the same step held at 13.4-15.4 ms for 45 s. A profile and the live
run that checks it should be measured pinned, ideally to the same kind of CPU.

Linux only (``os.sched_setaffinity``). Call before starting threads (torch, CUDA): the
threads a process starts later inherit the calling thread's CPU set
(:func:`set_process_cpus` moves threads already running).
"""

from __future__ import annotations

import os
import statistics
import time

from schedsim.errors import InputError


def loop_ms() -> float:
    """One fixed pure-Python loop, ms: the CPU's speed at the interpreter's kind of work."""
    t = time.perf_counter()
    acc = 0
    for i in range(20000):
        acc += i * i % 7
    return (time.perf_counter() - t) * 1e3


def probe_cpus(cpus, *, rounds: int = 3, loops: int = 9) -> dict[int, float]:
    """Median :func:`loop_ms` on each CPU of ``cpus`` (the calling thread pinned to each in
    turn, ``rounds`` passes of ``loops`` loops); leaves the thread's CPU set as it found it."""
    before = os.sched_getaffinity(0)
    samples: dict[int, list[float]] = {c: [] for c in cpus}
    try:
        for _ in range(rounds):
            for c in samples:
                os.sched_setaffinity(0, {c})
                samples[c].extend(loop_ms() for _ in range(loops))
    finally:
        os.sched_setaffinity(0, before)
    return {c: statistics.median(v) for c, v in samples.items()}


def parse_cpu(spec) -> int | str | None:
    """``--cpu``'s value: None (no pinning), ``"auto"`` or a CPU number. InputError otherwise."""
    if spec is None or spec == "":
        return None
    s = str(spec).strip().lower()
    if s == "auto":
        return "auto"
    try:
        cpu = int(s)
    except ValueError:
        raise InputError(f"--cpu: {spec!r} is not valid; expected a CPU number or auto") from None
    if cpu < 0:
        raise InputError(f"--cpu: {cpu} must be >= 0")
    return cpu


def pin_cpu(spec, count: int = 1) -> dict | None:
    """Pin the calling thread (and the threads it starts later) to one CPU, or to ``count``.

    ``spec``: None does nothing and returns None; a CPU number pins to it; ``"auto"``
    times every allowed CPU (:func:`probe_cpus`, about 0.5 s on 16 CPUs) and pins to the
    fastest now (which is no promise that it stays the fastest), or to the ``count``
    fastest (a live run: :func:`live_cpu_count`; busy threads on too few CPUs take turns).
    Returns the record a result's provenance keeps: ``cpu`` (the fastest), ``cpus``,
    ``how``, ``loop_ms`` on ``cpu`` after pinning, and for auto the probe. InputError for
    a CPU this process may not use, or no affinity support.
    """
    choice = parse_cpu(spec)
    if choice is None:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise InputError("--cpu: this platform cannot pin a process to a CPU (Linux only)")
    allowed = sorted(os.sched_getaffinity(0))
    record: dict = {"how": "auto" if choice == "auto" else "given", "allowed_cpus": allowed}
    if choice == "auto":
        probe = probe_cpus(allowed)
        cpus = sorted(probe, key=probe.get)[:max(int(count), 1)]
        record["probe_loop_ms"] = {str(c): round(v, 4) for c, v in probe.items()}
    elif choice not in allowed:
        raise InputError(f"--cpu: {choice} is not one of the CPUs this process may use "
                         f"({_ranges(allowed)})")
    else:
        cpus = [choice]
    os.sched_setaffinity(0, {cpus[0]})
    record["loop_ms"] = round(statistics.median(loop_ms() for _ in range(9)), 4)
    os.sched_setaffinity(0, set(cpus))
    record["cpu"], record["cpus"] = cpus[0], sorted(cpus)
    return record


def set_process_cpus(cpus) -> None:
    """Move every thread of this process (torch's and CUDA's included) to ``cpus``.

    ``os.sched_setaffinity(0, ...)`` moves the calling thread alone, and threads started
    earlier keep the set they were born with; this walks ``/proc/self/task``. A thread that
    ends meanwhile is skipped."""
    cpus = set(cpus)
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass


def live_cpu_count(instances: int) -> int:
    """CPUs ``--cpu auto`` pins a live run to: one per instance's serving thread, plus one
    for the load generator. With only one per instance, the H200's two-instance cells
    issued requests up to 1.9 ms late at p99 (unpinned: 0.14-0.31 ms), because the
    generator had no CPU of its own (experiments/fidelity/README.md)."""
    return max(int(instances), 1) + 1


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else f"{c}")
            start = None
    return ",".join(out)
