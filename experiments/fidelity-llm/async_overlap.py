"""Does the live loop's overlap (async scheduling) hide the host's time per step?

Runs one burst trace (every request at t=0, so both loops take the same steps) on the
paged engine, alternating the serial loop and the overlapped one (run_live_llm(overlap=True)),
and reports per loop (medians over the repetitions): the run's span (first step's start to
last step's end), the median period of decode-only steps (end to end), the engine call,
forming a step (``schedule_us``), and how much of forming each step ran while the step
before was still running (``overlap_ms``).

    python experiments/fidelity-llm/async_overlap.py --out async_overlap_cpu.json      # llama-tiny, CPU
    python experiments/fidelity-llm/async_overlap.py --model llama-1b --device cuda --dtype bf16 \
        --requests 64 --prompt 512 --output 256 --cpu auto --out async_overlap_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.profiling.host import pin_cpu  # noqa: E402


def one(overlap: bool, args) -> dict:
    import torch  # after pinning: its threads inherit the CPU set

    from schedsim.core.policy import Requests
    from schedsim.live.engines.llm_engine import PagedLLMEngine
    from schedsim.live.llm_driver import run_live_llm
    from schedsim.registry import build_policy
    from schedsim.traces.table import Trace

    n, prompt, output = args.requests, args.prompt, args.output
    trace = Trace.from_arrivals(np.zeros(n), input_tokens=np.full(n, prompt), output_tokens=np.full(n, output))
    blocks = n * (-(-(prompt + output + 1) // 16)) + 8
    policy = build_policy("paged-kv", {"block_size": 16, "num_gpu_blocks": blocks, "max_num_seqs": n})
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    with PagedLLMEngine(args.model, blocks, 16, args.device, dtype, max_context=prompt + output + 2) as eng:
        result, extra = run_live_llm(Requests.from_trace(trace), policy, eng, start_delay_s=0.0, overlap=overlap,
                                     engine_warmup=args.device != "cpu")
    s = extra["steps"]
    end = np.asarray(s["end_s"])
    decode = np.asarray(s["prefill_rows"]) == 0
    period = np.diff(end)[decode[1:] & decode[:-1]] * 1e3
    return {"overlap": overlap, "span_ms": float((result.step_end_ns[-1] - result.step_start_ns[0]) / 1e6),
            "steps": int(end.size), "decode_period_ms_p50": float(np.median(period)),
            "engine_ms_p50": extra["engine_ms"]["p50"], "schedule_us_p50": extra["schedule_us"]["p50"],
            "step_host_ms_p50": extra["step_host_ms"]["p50"], "overlap_ms_p50": extra["overlap_ms"].get("p50", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--output", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    ap.add_argument("--model", default="llama-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--cpu", default=None, help="pin to this CPU (a number, or auto)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    pinned = pin_cpu(args.cpu)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    runs = [one(overlap, args) for _ in range(args.reps) for overlap in (False, True)]
    summary = {}
    for overlap in (False, True):
        mine = [r for r in runs if r["overlap"] == overlap]
        summary["overlapped" if overlap else "serial"] = {
            k: float(np.median([r[k] for r in mine])) for k in mine[0] if k not in ("overlap", "steps")}
    s, o = summary["serial"], summary["overlapped"]
    summary["period_change"] = o["decode_period_ms_p50"] / s["decode_period_ms_p50"] - 1
    summary["span_change"] = o["span_ms"] / s["span_ms"] - 1
    record = {"settings": vars(args) | {"out": str(args.out) if args.out else None, "torch": torch.__version__,
                                        "cpu_pinning": pinned, "load_average": os.getloadavg()},
              "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
