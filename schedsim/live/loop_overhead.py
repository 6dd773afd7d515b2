"""The live loop's host time per step outside the engine call, measured by running the loop.

Between two engine calls the live runner (:mod:`schedsim.live.llm_driver`) asks the policy for a
step, builds the rows' block tables and prompt slices, and afterwards hands the tokens
back and tells the policy the step is done. On the H200 host that took 38-72 µs + 7-10 µs
per scheduled row in the LLM fidelity table's medium and near-capacity cells (least squares
over back-to-back steps of ``schedule_us`` plus the gap after the engine call), about
3% of a step, and the step profile (which times the engine call alone) does not hold it.
Vidur models the same CPU overheads of vLLM's loop.

:func:`measure_loop_overhead` runs the real live loop with the real policy over bursts of
``n`` requests arriving together, so every step is back to back with ``n`` rows. The time
from one step's start to the next, less the engine call, is the loop's overhead; a
least-squares line over ``n`` gives ``loop_overhead_us + loop_overhead_us_per_row * rows``,
the two sidecar keys the step cost model adds to every step
(:class:`~schedsim.cost.step_model.StepCostModel`). The step profiler runs it on its own engine
after the compositions. Standalone it runs against :class:`~schedsim.live.engines.null_engine.NullLLMEngine` (a step takes no
time), which misses the cache misses a real engine's step leaves behind: a lower bound.
It is the overhead of schedsim's own loop and of the policy it ran (``paged-kv`` by
default); a serving system's own loop has its own.

    python -m schedsim.live.loop_overhead --profile profiles/NAME.json   # measure, store in the sidecar
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from schedsim.core.policy import Requests
from schedsim.files import write_json
from schedsim.live.engines.null_engine import NullLLMEngine
from schedsim.live.llm_driver import run_live_llm
from schedsim.profiling.host import pin_cpu
from schedsim.registry import build_policy
from schedsim.traces.table import Trace

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
"""Concurrent requests per burst: the rows of every step in it."""


def measure_loop_overhead(policy_name: str = "paged-kv", *, engine=None, rows=ROWS, steps: int = 300,
                          prompt_tokens: int = 64, block_size: int = 16) -> dict | None:
    """Median loop overhead per step (µs) at each burst size of ``rows`` and the line fitted
    over them (``scipy.stats.linregress``).

    Each burst: ``n`` requests of ``prompt_tokens`` prompt tokens arriving at once, each
    generating ``steps`` tokens, on ``policy_name`` with enough KV blocks that nothing waits;
    the steps whose rows all decode (the prompt steps left out) are kept. ``engine``: an
    entered engine to run the steps on (the step profiler passes its own, so the loop runs
    among a real engine's cache misses; bursts whose blocks its pool cannot hold are left
    out); None, a :class:`~schedsim.live.engines.null_engine.NullLLMEngine`. None when fewer than two burst sizes fit.
    """
    from scipy.stats import linregress  # lazy: scipy.stats costs about a second of start-up

    per_rows, samples = {}, {}
    if engine is not None:
        block_size = engine.block_size
    for n in rows:
        blocks = n * (-(-(prompt_tokens + steps + 1) // block_size)) + 8
        eng = engine or NullLLMEngine(blocks, block_size, prompt_tokens + steps + 2)
        if blocks > eng.num_blocks or prompt_tokens + steps + 1 > eng.max_context:
            continue
        policy = build_policy(policy_name, {"block_size": block_size, "num_gpu_blocks": blocks,
                                            "max_num_seqs": max(n, 1)})
        trace = Trace.from_arrivals(np.zeros(n), input_tokens=np.full(n, prompt_tokens),
                                    output_tokens=np.full(n, steps))
        _, extra = run_live_llm(Requests.from_trace(trace), policy, eng, engine_warmup=False,
                                start_delay_s=0.0)
        s = extra["steps"]
        start, issue, end = (np.asarray(s[k], np.float64) for k in ("start_s", "issue_s", "end_s"))
        decode = (np.asarray(s["prefill_rows"]) == 0) & (np.asarray(s["n_rows"]) == n)
        overhead_us = (np.diff(start) - (end - issue)[:-1]) * 1e6
        keep = overhead_us[decode[:-1]]
        if keep.size:
            per_rows[n] = float(np.median(keep))
            samples[n] = int(keep.size)
    if len(per_rows) < 2:
        return None
    xs = np.array(sorted(per_rows), np.float64)
    fit = linregress(xs, [per_rows[int(x)] for x in xs])
    return {"loop_overhead_us": round(max(float(fit.intercept), 0.0), 3),
            "loop_overhead_us_per_row": round(max(float(fit.slope), 0.0), 4),
            "loop_overhead_fit": {"policy": policy_name, "engine": type(engine).__name__ if engine else "NullLLMEngine",
                                  "median_us_by_rows": {str(k): round(v, 3) for k, v in per_rows.items()},
                                  "steps_by_rows": {str(k): v for k, v in samples.items()},
                                  "r2": round(float(fit.rvalue) ** 2, 4), "prompt_tokens": prompt_tokens,
                                  "what": "live loop (schedsim.live.llm_driver), decode steps of bursts of n requests: "
                                          "next step's start minus this step's start, less the engine call; "
                                          "median per n, least-squares line over n"}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, help="a step profile's sidecar (.json) to store the result in")
    ap.add_argument("--policy", default="paged-kv")
    ap.add_argument("--steps", type=int, default=300, help="decode steps per burst")
    ap.add_argument("--cpu", default=None, help="pin to this CPU first (a number or auto)")
    args = ap.parse_args(argv)
    pinned = pin_cpu(args.cpu)
    out = measure_loop_overhead(args.policy, steps=args.steps)
    out["loop_overhead_fit"]["cpu_pinning"] = pinned
    print(json.dumps(out, indent=1))
    if args.profile is not None:
        write_json(args.profile, json.loads(args.profile.read_text()) | out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
