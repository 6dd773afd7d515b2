"""Does an eager step cost more after a run of decode-graph replays? (device diagnostic)

The live cells' prefill (eager) steps at light load came out 20-30% slower than the step
profile's same compositions (runs 7, 9 and 11: `paged-light`), while the long Mooncake
steps matched. At light load nearly every eager step follows tens of graph replays; the
profiler times compositions back to back. This times the same eager compositions (fresh
prompt lengths each time, as a server meets them):

- ``back_to_back``: one eager step after another;
- ``after_graph_N``: after N replays of a decode graph (8 rows at 2,000 tokens);
- ``after_graph_100_nogc``: the same with Python's garbage collector off;
- ``after_idle_ms``: after the host sleeps that long (the GPU idles).

Each sample records the engine call's wall time and its CUDA-event time.

    PYTHONPATH=. python3 experiments/fidelity-llm/diagnose_isolated_eager.py --out "$OUT/isolated.json"
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import diagnostic_args, diagnostic_engine, time_engine_call  # noqa: E402

COMPOSITIONS = ((256, 0), (256, 4), (1024, 8), (4096, 8))
"""(prefill tokens, decodes at 2,000 tokens of context) of the timed eager steps."""
SAMPLES = int(__import__("os").environ.get("SAMPLES", 25))


def main(argv=None) -> int:
    args = diagnostic_args(__doc__, argv)
    from schedsim.live.engines.llm_rows import EngineRow

    engine, vocab, pinned = diagnostic_engine(args)
    rng = np.random.default_rng(0)
    bs, num_blocks = engine.block_size, engine.num_blocks
    state = {"next": 1}

    def blocks(n_tokens):
        nb = -(-n_tokens // bs)
        if state["next"] + nb >= num_blocks:
            state["next"] = 1
        ids = np.arange(state["next"], state["next"] + nb)
        state["next"] += nb
        return ids

    def row(n_new, ctx):
        return EngineRow(rng.integers(1, vocab, size=n_new), ctx, blocks(ctx + n_new))

    decode_rows = [row(1, 2000) for _ in range(8)]   # the graph step, replayed as it is

    def eager_rows(prefill, decodes):
        q = prefill + int(rng.integers(-64, 65))      # a fresh length each time
        return [row(q, 0)] + [row(1, 2000) for _ in range(decodes)]

    out = {"cpu_pinning": pinned, "modes": {}}
    with engine as eng:
        for _ in range(20):                            # warm-up: graphs captured, kernels loaded
            eng.execute(decode_rows)
            for p, d in COMPOSITIONS:
                eng.execute(eager_rows(p, d))
        graph_ms = []
        for _ in range(50):
            t = time.perf_counter()
            eng.execute(decode_rows)
            graph_ms.append((time.perf_counter() - t) * 1e3)
        out["graph_step_wall_ms_median"] = float(np.median(graph_ms))
        out["graph_replayed"] = bool(eng.last_graph)

        def run(mode, before):
            res = {}
            for p, d in COMPOSITIONS:
                wall, gpu = [], []
                for _ in range(SAMPLES):
                    before()
                    w, g = time_engine_call(eng, eager_rows(p, d))
                    wall.append(w)
                    gpu.append(g)
                res[f"{p}+{d}"] = {"wall_ms_median": float(np.median(wall)), "wall_ms_mean": float(np.mean(wall)),
                                   "gpu_ms_median": float(np.median(gpu)), "wall_ms": [round(w, 3) for w in wall]}
            out["modes"][mode] = res
            print(mode, {k: round(v["wall_ms_median"], 2) for k, v in res.items()}, flush=True)

        def graphs(n):
            def before():
                for _ in range(n):
                    eng.execute(decode_rows)
            return before

        def idle(ms):
            def before():
                time.sleep(ms / 1e3)
            return before

        run("back_to_back", lambda: None)
        for n in (1, 10, 100):
            run(f"after_graph_{n}", graphs(n))
        gc.disable()
        run("after_graph_100_nogc", graphs(100))
        gc.enable()
        for ms in (5, 50):
            run(f"after_idle_{ms}ms", idle(ms))
        run("back_to_back_again", lambda: None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
