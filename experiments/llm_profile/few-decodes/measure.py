"""The default step grid plus a few long decodes beside a prefill chunk (device script).

Why: fidelity-llm's Mooncake cell ran eager steps of an 8,192-token chunk beside 5-13
decodes at 27-31k tokens of context 20-28 ms slower than the step model priced them
(run 7, -21% at the median), and the default grid has no eager step with few decodes over
a long context. This measures the default grid and 64 such compositions in one call:
chunks of 512 and 8,192 tokens beside 1, 2, 4, 8 or 16 decodes at contexts 2,000, 4,000,
4,095, 16,000, 32,000 and 32,767 (odd numbers of 16-token blocks never split the decode
attention's width, 256 and 2,048 blocks do: PagedLLMEngine.decode_splits), and a 2,048-token
chunk beside 2 or 8 decodes at 4,000 and 16,000. analyze.py reads the result.

    PYTHONPATH=. python3 experiments/llm_profile/few-decodes/measure.py --cpu auto --max-time-s 100 \
        --out "$OUT/prof/llama-1b-bf16-h200-steps.csv"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

FEW_DECODE_PREFILL = ((1, 512), (1, 8192))
FEW_DECODES = (1, 2, 4, 8, 16)
FEW_DECODE_CONTEXTS = (2000, 4000, 4095, 16000, 32000, 32767)


def few_decode_compositions():
    from schedsim.profiling.step_grid import Composition

    grid = [Composition(s, q, 0, b, c) for s, q in FEW_DECODE_PREFILL for b in FEW_DECODES
            for c in FEW_DECODE_CONTEXTS]
    return grid + [Composition(1, 2048, 0, b, c) for b in (2, 8) for c in (4000, 16000)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-time-s", type=float, default=100.0)
    ap.add_argument("--cpu", default="auto")
    ap.add_argument("--model", default="builtin:llama-1b")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    from dataclasses import replace

    from schedsim.profiling.host import pin_cpu
    from schedsim.profiling.step_profiler import PlainStepProgress, run_step_profile, spec_from_flags
    from schedsim.profiling.step_grid import step_grid

    pinned = pin_cpu(None if args.cpu == "none" else args.cpu)
    spec = spec_from_flags(model=args.model, dtype="bf16", device=args.device, max_time_s=args.max_time_s)
    grid = step_grid(spec.max_context) + [c for c in few_decode_compositions() if c.longest <= spec.max_context]
    outcome = run_step_profile(replace(spec, compositions=tuple(grid)), args.out, PlainStepProgress(),
                               cpu_pinning=pinned)
    print(f"wrote {outcome.path} ({outcome.cells} step compositions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
