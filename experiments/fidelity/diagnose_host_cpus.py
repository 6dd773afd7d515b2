"""Are some of the GPU host's CPUs slower than others? (host diagnostic)

The LLM drift diagnostic (experiments/fidelity-llm/diagnose_drift.py) found the host, not
the GPU, switching between two speeds for seconds at a time: a fixed pure-Python loop took
1.2 ms or 1.8-2.2 ms, and a launch-bound eager step 14-17 ms or 21-29 ms (1-second
medians) with it, while a matrix product and a graph decode step held within 1%. The request-level cells saw the
same kind of drift in their host gaps. If the slow phases belong to particular vCPUs (a
busy hyperthread sibling on the host, interrupt handling), pinning the serving process to
a fast one removes them; if they move over the whole machine, pinning cannot help.

This pins itself to each CPU in turn (in a shuffled order, ``--rounds`` times) and times
the loop there; it records the machine's topology, the kernel's steal time over the run,
and an unpinned reference. Prints per-CPU medians and writes JSON.

    PYTHONPATH=. python3 experiments/fidelity/diagnose_host_cpus.py --out "$OUT/cpus.json"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from schedsim.profiling.host import loop_ms  # noqa: E402  (one fixed pure-Python loop, ms)


def sample(n: int) -> float:
    return statistics.median(loop_ms() for _ in range(n))


def steal_ticks() -> dict:
    """Per-CPU steal ticks from /proc/stat (the hypervisor ran someone else); {} where absent."""
    out = {}
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            f = line.split()
            if f[0].startswith("cpu") and len(f) > 8:
                out[f[0]] = int(f[8])
    except OSError:
        pass
    return out


def topology(cpus: list[int]) -> dict:
    out = {}
    for c in cpus:
        p = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        out[c] = p.read_text().strip() if p.exists() else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loops", type=int, default=25, help="loops per CPU per round (median taken)")
    args = ap.parse_args(argv)

    allowed = sorted(os.sched_getaffinity(0))
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    steal0, t0 = steal_ticks(), time.time()
    unpinned = [sample(args.loops)]
    per_cpu = {c: [] for c in allowed}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = allowed[:]
        rng.shuffle(order)
        for c in order:
            os.sched_setaffinity(0, {c})
            time.sleep(0.005)
            per_cpu[c].append(sample(args.loops))
        os.sched_setaffinity(0, set(allowed))
        unpinned.append(sample(args.loops))
    steal1 = steal_ticks()
    medians = {c: statistics.median(v) for c, v in per_cpu.items()}
    for c in allowed:
        print(f"cpu {c:3d}  loop ms per round {' '.join(f'{x:5.2f}' for x in per_cpu[c])}  "
              f"steal ticks {steal1.get(f'cpu{c}', 0) - steal0.get(f'cpu{c}', 0)}", flush=True)
    print(f"unpinned {' '.join(f'{x:5.2f}' for x in unpinned)}; fastest cpu {min(medians, key=medians.get)}")
    out = {"cpu_model": model, "allowed_cpus": allowed, "topology_siblings": topology(allowed),
           "loops_per_sample": args.loops, "rounds": args.rounds, "per_cpu_loop_ms": per_cpu,
           "per_cpu_median_ms": medians, "unpinned_loop_ms": unpinned,
           "fastest_cpu": min(medians, key=medians.get), "wall_s": time.time() - t0,
           "steal_ticks": {k: steal1.get(k, 0) - steal0.get(k, 0) for k in steal1},
           "loadavg": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
