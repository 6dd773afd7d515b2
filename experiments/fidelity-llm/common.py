"""Cell traces and live results on disk, for run_h200.py (device) and analyze.py (here).

numpy only (the device image has no pyarrow): a cell's trace slice is ``traces/NAME.npz``
(arrival_s, input_tokens, output_tokens, and hash_offsets / hash_ids for Mooncake) and its
live result is ``cells/NAME/result.npz`` (every :class:`~schedsim.core.llm_results.LLMResult`
array) with ``result.json`` (its scalars and the policy's stats).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def load_cells():
    spec = importlib.util.spec_from_file_location("fidelity_llm_cells", HERE / "cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_cell_trace(path: Path):
    from schedsim.traces.table import Trace

    d = np.load(path)
    meta = {"hash_block_tokens": int(d["hash_block_tokens"])} if "hash_ids" in d else {}
    trace = Trace.from_arrivals(d["arrival_s"], input_tokens=d["input_tokens"], output_tokens=d["output_tokens"],
                                request_id=d["request_id"], source=str(path), meta=meta)
    if "hash_ids" in d:
        from dataclasses import replace

        trace = replace(trace, hash_offsets=d["hash_offsets"].astype(np.int64), hash_ids=d["hash_ids"].astype(np.int64))
    return trace


ARRAYS = ("status", "scheduled_ns", "first_token_ns", "end_ns", "tokens_out", "preemptions", "prefix_hit_tokens",
          "itl_ns", "itl_count", "step_start_ns", "step_end_ns", "step_repeats", "step_seqs", "step_tokens",
          "step_prefill_tokens", "step_kv_blocks", "step_waiting", "step_preempted")


def save_result(cell_dir: Path, result) -> None:
    from schedsim.files import json_safe

    np.savez_compressed(cell_dir / "result.npz", **{k: getattr(result, k) for k in ARRAYS})
    stats = {k: v for k, v in result.stats.items() if isinstance(v, (int, float, str, dict))}
    (cell_dir / "result.json").write_text(json.dumps(json_safe(
        {"kv_blocks_total": result.kv_blocks_total, "seed": result.seed, "stats": stats, "meta": result.meta}),
        indent=2, default=str))


def load_result(cell_dir: Path, requests):
    from schedsim.core.llm_results import LLMResult

    d = np.load(cell_dir / "result.npz")
    info = json.loads((cell_dir / "result.json").read_text())
    keep = d["status"].shape[0]
    req = requests if keep == len(requests) else requests.head(keep)
    return LLMResult(requests=req, **{k: d[k] for k in ARRAYS}, kv_blocks_total=info["kv_blocks_total"],
                     seed=info["seed"], stats=info["stats"], meta=info["meta"])


def smoke(cell: dict, trace):
    """The CPU check's version of a cell (run_h200.py --smoke, analyze.py --smoke): 12 short requests."""
    from dataclasses import replace

    trace = trace.slice(0, 12)
    trace = replace(trace, input_tokens=np.minimum(trace.input_tokens, 100),
                    output_tokens=np.minimum(trace.output_tokens, 20), hash_offsets=None, hash_ids=None)
    return cell | {"params": cell["params"] | {"num_gpu_blocks": 60, "max_model_len": 256}}, trace


def engine_settings(runs) -> dict:
    """The one live engine of the cells and its warm-up, from (requests, policy) pairs of all
    cells (run_h200.py builds it so; analyze.py prices its warm-up): ``num_blocks``,
    ``max_context``, ``max_seqs`` and ``prefill_tokens``."""
    from schedsim.live.llm_warmup import engine_context, warmup_prefill_tokens

    return {"num_blocks": max(p.budget.num_blocks for _, p in runs),
            "max_context": max(engine_context(r, p) for r, p in runs),
            "max_seqs": max(p.max_num_seqs for _, p in runs),
            "prefill_tokens": max(warmup_prefill_tokens(r, p) for r, p in runs)}


def time_engine_call(engine, rows) -> tuple[float, float]:
    """(wall ms, CUDA-event ms) of one ``engine.execute(rows)``: what the diagnostics compare."""
    import time

    t = time.perf_counter()
    engine.execute(rows)
    return (time.perf_counter() - t) * 1e3, engine.last_gpu_ms


def diagnostic_args(doc: str, argv=None):
    """The flags of a device diagnostic: --out (JSON), --cpu (a CPU, auto: the fastest now;
    none), --model (a builtin decoder) and --device."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", default="auto")
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--device", default="cuda")
    return ap.parse_args(argv)


def diagnostic_engine(args, num_blocks: int = 16384, block_size: int = 16, max_context: int = 8192):
    """Pin the process as ``args.cpu`` says and build the engine a diagnostic times (bf16 on
    a GPU, fp32 on the CPU): (the engine, not yet entered; the model's vocabulary size; the
    pinning record)."""
    import torch

    from schedsim.live.engines.decoder import CONFIGS
    from schedsim.live.engines.llm_engine import PagedLLMEngine
    from schedsim.profiling.host import pin_cpu

    pinned = pin_cpu(None if args.cpu == "none" else args.cpu)
    engine = PagedLLMEngine(args.model, num_blocks, block_size, device=args.device, max_context=max_context,
                            dtype=torch.bfloat16 if args.device != "cpu" else torch.float32)
    return engine, CONFIGS[args.model].vocab, pinned
