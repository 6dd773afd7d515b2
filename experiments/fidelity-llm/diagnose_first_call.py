"""Why do eager steps of new shapes run 5-15x slower the first time? (device diagnostic)

Run 2 of the LLM fidelity table showed eager (prefill) steps of paged-kv cells taking
100-190 ms on the GPU where the same composition later took 9-25 ms; lengths the eager
warm-up had run were fast. This script times, on the cells' engine (llama-1b, bf16,
16,384 blocks), fresh prefill lengths twice each (first and second call), under:

- ``default``: torch's own SDPA backend choice;
- ``no-cudnn``: ``torch.backends.cuda.enable_cudnn_sdp(False)``;
- ``flash-only`` / ``efficient-only``: ``sdpa_kernel`` restricted to one backend;

alone over no context (causal SDPA) and over a cached context (lower-right mask), and
records the caching allocator's counters (device mallocs, retries) around each call. One
first call per mode runs under ``torch.profiler`` and its top operators are kept.

    PYTHONPATH=. python3 experiments/fidelity-llm/diagnose_first_call.py --out "$OUT/diag-llm.json"

``diagnose_first_call.json`` is its output against the engine as it was then (commit
30cf61a, torch's default SDPA choice in every step); since then the engine itself keeps
cuDNN out of eager steps, so ``default`` now measures what ``no-cudnn`` did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--blocks", type=int, default=16384)
    args = ap.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from schedsim.live.engines.llm_engine import NULL_BLOCK, EngineRow, PagedLLMEngine

    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "sdp_enabled": {k: getattr(torch.backends.cuda, f"{k}_sdp_enabled")()
                           for k in ("flash", "mem_efficient", "math", "cudnn") if hasattr(torch.backends.cuda, f"{k}_sdp_enabled")},
           "modes": {}}
    rng = np.random.default_rng(0)

    def row(n, c):
        return EngineRow(rng.integers(5, 1000, size=n), c, [NULL_BLOCK] * -(-(c + n) // 16))

    def timed(engine, rows):
        mem0 = torch.cuda.memory_stats()
        t = time.perf_counter()
        engine.execute(rows)
        wall = (time.perf_counter() - t) * 1e3
        mem1 = torch.cuda.memory_stats()
        d = {k: mem1.get(k, 0) - mem0.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}
        return {"wall_ms": wall, "gpu_ms": engine.last_gpu_ms} | d

    modes = {
        "default": contextlib.nullcontext,
        "no-cudnn": None,
        "flash+efficient": lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]),
        "efficient-only": lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]),
    }
    with PagedLLMEngine("llama-1b", args.blocks, 16, "cuda", torch.bfloat16, cuda_graphs=True, seed=0,
                        max_context=16384) as engine:
        engine.execute([row(64, 0)])  # load the model's kernels once
        base = 101
        for mode, ctx_fn in modes.items():
            if mode == "no-cudnn":  # stays off for the later modes and the mixed steps
                torch.backends.cuda.enable_cudnn_sdp(False)
                ctx_fn = contextlib.nullcontext
            try:
                with ctx_fn():
                    out["modes"][mode] = time_mode(engine, mode, base, row, timed)
            except RuntimeError as e:  # a backend that cannot take this call (GQA)
                out["modes"][mode] = {"error": str(e)}
                print(f"{mode}: {e}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1, default=str))
            base += 7
        # Mixed steps of a fresh chunk length with decodes (paged-kv's eager steps).
        mixed = []
        for n in (377, 911, 2047):
            rows = [row(n, 0)] + [row(1, 1500)] * 8
            mixed.append({"n": n, "first": timed(engine, rows), "second": timed(engine, rows)})
            print(f"mixed n={n} +8 decodes: first {mixed[-1]['first']['gpu_ms']:.2f} second {mixed[-1]['second']['gpu_ms']:.2f}", flush=True)
        out["mixed_no_cudnn"] = mixed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    return 0


def time_mode(engine, mode: str, base: int, row, timed) -> dict:
    """Fresh lengths (offset by ``base``) timed three times each, then one profiled first call."""
    from torch.profiler import ProfilerActivity, profile

    res = []
    for n, c in [(389, 0), (1317, 0), (181, 0), (4083, 0), (383, 1330), (212, 1426), (1263, 4104)]:
        n += base  # a length no earlier mode ran
        rows = [row(n, c)]
        first, second, third = (timed(engine, rows) for _ in range(3))
        res.append({"n": n, "context": c, "first": first, "second": second, "third": third})
        print(f"{mode:16s} n={n:5d} ctx={c:5d} first {first['gpu_ms']:8.2f} ms (mallocs {first['num_device_alloc']}, "
              f"retries {first['num_alloc_retries']})  second {second['gpu_ms']:7.2f}  third {third['gpu_ms']:7.2f}",
              flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.execute([row(700 + base, 0)])
    table_gpu = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8)
    print(table_gpu, flush=True)
    return {"calls": res, "profile_cpu": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12),
            "profile_gpu": table_gpu}


if __name__ == "__main__":
    sys.exit(main())
