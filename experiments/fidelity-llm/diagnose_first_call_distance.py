"""Is an eager step's first call of a token count slow only far from counts already run? (device diagnostic)

Live eager steps of up to 1,024 tokens whose token count the engine had not run before were
priced 13-26% lower, relative to the rest, than steps of counts it had run (runs 7, 9 and
11: `paged-light`, `paged-medium`), while the step profiler, whose fresh samples move the
nominal count by the nearest unseen few tokens, measured fresh samples only 0.37 ms (median
over 98 compositions) above warm ones. If GEMM kernel selection is cached per band of M,
a count next to one already run is not new to it. This times one prefill (+ 4 decodes at
2,000 tokens) at token counts that are, for the engine, new and far (the farthest from any
count run), new and next to one run (+1, +8), and repeated; first and second call each.

    PYTHONPATH=. python3 experiments/fidelity-llm/diagnose_first_call_distance.py --out "$OUT/first_call_distance.json"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import diagnostic_args, diagnostic_engine, time_engine_call  # noqa: E402

PER_KIND = 30


def main(argv=None) -> int:
    args = diagnostic_args(__doc__, argv)
    from schedsim.live.engines.llm_rows import EngineRow

    engine, vocab, pinned = diagnostic_engine(args)
    rng = np.random.default_rng(1)
    bs = engine.block_size

    def rows(m: int, decodes: int = 4) -> list:
        # m tokens in all: a prefill of m - decodes tokens and the decodes (each over its own blocks).
        out = [EngineRow(rng.integers(1, vocab, size=m - decodes), 0, np.arange(1, 1 + -(-(m - decodes) // bs)))]
        for k in range(decodes):
            start = 200 + k * 130
            out.append(EngineRow(rng.integers(1, vocab, size=1), 2000, np.arange(start, start + 126)))
        return out

    seen: set[int] = set()
    out = {"cpu_pinning": pinned, "kinds": {}}
    with engine as eng:
        for m in range(128, 2049, 128):       # warm-up: a coarse grid of counts
            for _ in range(3):
                eng.execute(rows(m))
            seen.add(m)

        def far() -> int:
            # A count in 140..2000 as far as any can be from the counts run so far.
            candidates = np.arange(140, 2001)
            dist = np.min(np.abs(candidates[:, None] - np.array(sorted(seen))[None, :]), axis=1)
            return int(rng.choice(candidates[dist == dist.max()]))

        def near(d: int):
            def pick() -> int:
                while True:
                    m = int(rng.choice(sorted(seen))) + d
                    if m not in seen and m <= 2100:
                        return m
            return pick

        def repeated() -> int:
            return int(rng.choice(sorted(seen)))

        kinds = {"new_far": far, "new_plus_1": near(1), "new_plus_8": near(8), "repeated": repeated}
        order = [k for _ in range(PER_KIND) for k in kinds]   # interleaved, so drift spreads evenly
        res = {k: {"first_wall_ms": [], "second_wall_ms": [], "first_gpu_ms": [], "m": []} for k in kinds}
        for k in order:
            m = kinds[k]()
            w1, g1 = time_engine_call(eng, rows(m))
            w2, _ = time_engine_call(eng, rows(m))
            seen.add(m)
            r = res[k]
            r["first_wall_ms"].append(round(w1, 3))
            r["second_wall_ms"].append(round(w2, 3))
            r["first_gpu_ms"].append(round(g1, 3))
            r["m"].append(m)
        for k, r in res.items():
            first, second = np.array(r["first_wall_ms"]), np.array(r["second_wall_ms"])
            r["first_median_ms"], r["second_median_ms"] = float(np.median(first)), float(np.median(second))
            r["extra_median_ms"] = float(np.median(first - second))
            print(f"{k:12s} first {r['first_median_ms']:6.2f}  second {r['second_median_ms']:6.2f}  "
                  f"first - second median {r['extra_median_ms']:+6.2f} ms", flush=True)
        out["kinds"] = res
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
