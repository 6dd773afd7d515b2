"""The LLM fidelity table's device half: every cell live on the H200 (analyze.py is the other half).

Runs on the device image (Python 3.12, torch with CUDA, numpy; no simpy, no pyarrow, no
typer needed): it imports schedsim.live.llm_driver, schedsim.live.engines.llm_engine, the policies and
schedsim.core.llm_metrics, none of which imports simpy, pyarrow or typer. This is what
``schedsim live TRACE --backend torch-llm --model builtin:llama-1b --device cuda [cell flags]``
does, with the CLI's trace loading and CSV writing left to analyze.py, and one engine (one
weight load, one KV pool as large as the largest cell's, one set of captured decode graphs)
shared by all cells.

Per cell (cells.py) it writes OUT/cells/NAME/: result.npz + result.json (the LLMResult;
analyze.py writes requests.csv and steps.csv from it), summary.json, live.json (engine
timings, lateness, failures) and live_steps.csv. Cells already finished (a summary.json) are
skipped, so a rerun into the same OUT resumes; --budget-s stops starting cells in time;
--cells NAME,NAME runs a subset; --tar PATH ends by packing OUT into one .tar.gz (the device
tool brings back only shallow folders).

    export PYTHONPATH=. PYTHONUNBUFFERED=1
    python3 experiments/fidelity-llm/run_h200.py --out /tmp/fl/fidelity-llm --tar "$OUT/fl.tgz"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import HERE, engine_settings, load_cell_trace, load_cells, save_result, smoke  # noqa: E402
from schedsim.files import json_safe  # noqa: E402
from schedsim.live.llm_driver import run_live_llm, write_live_steps_csv  # noqa: E402
from schedsim.live.llm_warmup import warm_up  # noqa: E402
from schedsim.core.llm_metrics import summarize_llm  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")) / "fidelity-llm")
    ap.add_argument("--cells", default="", help="comma-separated cell names (or substrings of names): only those")
    ap.add_argument("--budget-s", type=float, default=500.0, help="start no cell after this much wall time")
    ap.add_argument("--drain-s", type=float, default=60.0, help="time limit past a cell's last arrival")
    ap.add_argument("--tar", type=Path, default=None, help="at the end, pack OUT into this .tar.gz")
    ap.add_argument("--cpu", default="auto",
                    help="pin to this CPU before the engine starts: a number, auto (the fastest now) or none")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of this script: llama-tiny, fp32, 60 blocks, 12 requests per cell")
    args = ap.parse_args(argv)
    from schedsim.errors import InputError
    from schedsim.profiling.host import pin_cpu

    try:
        # Before torch starts its threads: they inherit the CPU set (schedsim.profiling.host says why).
        pinned = pin_cpu(None if args.cpu.strip().lower() == "none" else args.cpu)
    except InputError as exc:
        ap.error(str(exc))
    print(f"cpu pinning: {pinned}", flush=True)

    import torch

    from schedsim.live.engines.llm_engine import PagedLLMEngine
    from schedsim.profiling.measure import gpu_state, machine_metadata

    t_start = time.perf_counter()
    out = args.out
    (out / "cells").mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join(sys.argv)}", flush=True)
    gpu_before = gpu_state() if not args.smoke else None
    cells_mod = load_cells()
    cells = select(cells_mod.CELLS, args.cells)
    model, device, dtype = ("llama-tiny", "cpu", torch.float32) if args.smoke else ("llama-1b", "cuda", torch.bfloat16)
    if args.smoke:
        torch.set_num_threads(1)
    runs = []
    for cell in cells:
        trace = load_cell_trace(HERE / "traces" / f"{cell['name']}.npz")
        if args.smoke:
            cell, trace = smoke(cell, trace)
        params = dict(cell["params"])
        runs.append((cell, trace, Requests.from_trace(trace), build_policy(cells_mod.policy_name(cell), params)))
    settings = engine_settings([(r, p) for _, _, r, p in runs])
    blocks, context, prefill = settings["num_blocks"], settings["max_context"], settings["prefill_tokens"]
    with PagedLLMEngine(model, blocks, 16, device, dtype, cuda_graphs=True, seed=0,
                        max_context=context) as engine:
        setup = warm_up(engine, max_seqs=settings["max_seqs"], max_context=context, prefill_tokens=prefill)
        setup["prefill_tokens"] = prefill
        print(f"engine: {blocks} blocks, max context {context}; warm-up {setup['engine_warmup_s']:.1f} s "
              f"(eager {setup['warmup_eager_s']:.1f} s, {setup['warmup_eager_steps']} steps up to {prefill} "
              f"tokens), {setup['warmup_decode_shapes']} decode shapes, {len(engine.graph_shapes)} graphs "
              f"[{time.perf_counter() - t_start:.0f} s]", flush=True)
        done, skipped = [], []
        for cell, trace, requests, policy in runs:
            cell_dir = out / "cells" / cell["name"]
            if (cell_dir / "summary.json").exists():
                continue
            if time.perf_counter() - t_start > args.budget_s:
                skipped.append(cell["name"])
                continue
            cell_dir.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            limit = float(trace.arrival_s[-1]) + args.drain_s
            result, extra = run_live_llm(requests, policy, engine, time_limit_s=limit, engine_warmup=False)
            wall = time.perf_counter() - t0
            save_result(cell_dir, result)
            write_live_steps_csv(cell_dir / "live_steps.csv", extra["steps"])
            timing = {k: v for k, v in extra.items() if k not in ("steps", "tokens")}
            (cell_dir / "live.json").write_text(json.dumps(json_safe(
                timing | {"cell": cell, "wall_s": wall, "warmup": setup, "cpu_pinning": pinned,
                          "engine": engine.describe(), "smoke": args.smoke,
                          "gpu": torch.cuda.get_device_name() if device == "cuda" else None}), indent=2, default=str))
            s = summarize_llm(result)
            s["partial"] = bool(extra["partial"])
            s["live"] = {k: timing[k] for k in ("engine_gpu_ms", "engine_ms", "step_host_ms", "schedule_us",
                                                "delivery_delay_us", "swaps", "failed_steps")}
            (cell_dir / "summary.json").write_text(json.dumps(json_safe(s), indent=2, sort_keys=True) + "\n")
            done.append(cell["name"])
            print(f"{cell['name']:<24} {len(requests):4d} req  TTFT p50 {s['ttft_p50_ms']:8.1f} p99 "
                  f"{s['ttft_p99_ms']:8.1f}  TPOT p50 {s['tpot_p50_ms']:6.2f} p99 {s['tpot_p99_ms']:6.2f}  "
                  f"E2E p99 {s['e2e_p99_ms']:8.0f} ms  pre {s['preemptions']}  steps {s['steps']}  "
                  f"host/step {timing['step_host_ms'].get('mean', float('nan')):.3f} ms  "
                  f"{'PARTIAL ' if extra['partial'] else ''}wall {wall:.0f} s [{time.perf_counter() - t_start:.0f} s]",
                  flush=True)
        warnings = list(engine.warnings)
    (out / "run_info.json").write_text(json.dumps(json_safe({
        "cells_done": done, "cells_skipped_budget": skipped, "wall_s": time.perf_counter() - t_start,
        "setup": setup, "engine_warnings": warnings, "smoke": args.smoke, "cpu_pinning": pinned,
        "machine": machine_metadata(gpu_before) if not args.smoke else None}), indent=2, default=str))
    print(f"done {len(done)} cells, skipped {len(skipped)} for the budget, {time.perf_counter() - t_start:.0f} s")
    if args.tar is not None:
        args.tar.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.tar.with_name(args.tar.name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(out, arcname=out.name)
        tmp.replace(args.tar)
        print(f"packed {out} into {args.tar} ({args.tar.stat().st_size / 1e6:.1f} MB)", flush=True)
    return 0


def select(cells: list, spec: str) -> list:
    """The cells ``spec`` names (comma-separated): a name picks its cell, another word every
    cell whose name contains it; all cells when empty. SystemExit on a word matching none."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        return list(cells)
    names = {c["name"] for c in cells}
    picked = set()
    for w in words:
        hit = {w} if w in names else {n for n in names if w in n}
        if not hit:
            raise SystemExit(f"--cells: {w!r} names no cell; cells: {', '.join(c['name'] for c in cells)}")
        picked |= hit
    return [c for c in cells if c["name"] in picked]


if __name__ == "__main__":
    sys.exit(main())
