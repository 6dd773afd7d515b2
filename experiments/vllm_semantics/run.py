"""How much each vLLM scheduler switch moves a plan: TTFT and TPOT p50/p99 and preemptions
of ``paged-kv`` under each ``--vllm-compat`` preset and with each switch flipped alone from
the current defaults, on the Azure LLM 2023 conversation and Mooncake conversation traces
under KV pressure. Steps priced by the bundled H200 decoder profile (llama-1b shapes).

    python experiments/vllm_semantics/run.py        # writes results.csv and summary.md here

Reads ../shared/traces/ (skips a trace cleanly when absent).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
TRACES = REPO.parent / "shared" / "traces"

# Operating points: each trace under KV pressure, below the engine's saturation.
SETUPS = {
    "azure-conv": dict(file="azure_llm_2023_conv.csv", rate_scale=2.0, num_gpu_blocks=2049,   # 1 GiB
                       max_model_len=8192),
    "mooncake": dict(file="mooncake_conversation.jsonl", rate_scale=0.25, num_gpu_blocks=8193,  # 4 GiB
                     max_model_len=131072),
}
SPEC = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7, "draft_cost_fraction": 0.1}'
CONFIGS = {
    "current (default)": {},
    "--no-scheduler-reserve-full-isl": {"scheduler_reserve_full_isl": False},
    "--no-async-scheduling": {"async_scheduling": False},
    "--no-enable-prefix-caching": {"enable_prefix_caching": False},
    "--no-enable-chunked-prefill": {"enable_chunked_prefill": False},
    "--long-prefill-token-threshold 2048": {"long_prefill_token_threshold": 2048},
    "--max-num-partial-prefills 1": {"max_num_partial_prefills": 1},
    "--scheduling-policy priority": {"scheduling_policy": "priority"},
    "--vllm-compat 0.10": {"vllm_compat": "0.10"},
    "--vllm-compat 0.8": {"vllm_compat": "0.8"},
    "--speculative-config eagle k=3 at 0.7": {"speculative_config": SPEC},
}
KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")


def one(task: tuple[str, str]) -> dict:
    trace_name, label = task
    from schedsim.core.llm_metrics import summarize_llm
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.core.policy import Requests
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile
    from schedsim.live.llm_warmup import live_warm_tokens
    from schedsim.registry import build_policy
    from schedsim.run.llm_runner import default_step_profile_path
    from schedsim.traces.io import load_trace, scale_rate

    setup = SETUPS[trace_name]
    req = Requests.from_trace(scale_rate(load_trace(TRACES / setup["file"]), setup["rate_scale"]))
    policy = build_policy("paged-kv", {"num_gpu_blocks": setup["num_gpu_blocks"],
                                       "max_model_len": setup["max_model_len"]} | CONFIGS[label])
    profile = load_step_profile(default_step_profile_path())
    cost = StepCostModel.from_profile(profile)   # as `schedsim run` builds it
    cost.price_drafts(policy.speculative)
    if cost.first_call_ns:
        cost.warm_tokens = live_warm_tokens(req, policy, profile.cuda_graph_batch_sizes)
    t = time.perf_counter()
    result = simulate_llm(req, policy, cost)
    s = summarize_llm(result)
    return {"trace": trace_name, "config": label, **{k: s[k] for k in KEYS},
            "preemptions": int(result.preemptions.sum()), "throughput_rps": s["throughput_rps"],
            "completed": s["completed"], "prefix_hit_rate": s.get("prefix_hit_rate"),
            "sim_s": round(time.perf_counter() - t, 1)}


def main() -> None:
    present = [name for name, setup in SETUPS.items() if (TRACES / setup["file"]).exists()]
    for name in SETUPS:
        if name not in present:
            print(f"{TRACES / SETUPS[name]['file']} not found: skipping {name} (schedsim trace download)")
    if not present:
        return
    tasks = [(name, label) for name in present for label in CONFIGS]
    with ProcessPoolExecutor(2) as pool:
        rows = list(pool.map(one, tasks))
    df = pd.DataFrame(rows)
    df.to_csv(HERE / "results.csv", index=False, float_format="%.4g")
    lines = []
    for name in present:
        part = df[df.trace == name].set_index("config")
        base = part.loc["current (default)"]
        s = SETUPS[name]
        lines += [f"### {name}: x{s['rate_scale']:g} its rate, {s['num_gpu_blocks'] - 1:,} KV blocks of 16 tokens, "
                  f"max_model_len {s['max_model_len']:,}", "",
                  "| config | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | preemptions | req/s |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for label, r in part.iterrows():
            cells = []
            for k in KEYS:
                change = "" if label == "current (default)" else f" ({(r[k] / base[k] - 1) * 100:+.0f}%)"
                cells.append(f"{r[k]:,.1f}{change}")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {r['preemptions']:,} | {r['throughput_rps']:.2f} |")
        lines.append("")
    (HERE / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
