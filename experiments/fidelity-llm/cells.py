"""The cells of the LLM fidelity table, shared by run_h200.py (device) and analyze.py (here).

A cell is one policy with its flags on one trace slice at one rate. Slices come from the
shared traces (``../shared/traces``): the Azure LLM 2023 conversation trace from t = 1200 s
(its native rate there is about 5.7 req/s) and the Mooncake conversation trace from t = 600 s.
A slice takes the first ``requests`` arrivals of the window and replays them at
``rate_rps`` (arrival times scaled; the order and the token counts are the trace's).

Loads are fractions of each policy's capacity as the simulator predicts it on the bundled
profile (profiles/llama-1b-bf16-h200-steps.csv) with 16,384 KV blocks (8 GiB of llama-1b KV)
and max_model_len 16,384: on this slice paged-kv's TPOT climbs past 30 ms near 19-22 req/s
(decode attention pads every row to the batch's longest context), continuous --reservation
max saturates near 10.8 req/s (15 reservations fit), static batch 8 near 3.9. The
preempting cell gives paged-kv 1,500 blocks (24k tokens): about a dozen recompute
preemptions predicted. Mooncake prompts are long (mean 13.6k tokens); requests over
max_model_len 32,768 are rejected alike by both drivers.

Imports only the standard library.
"""

from __future__ import annotations

AZURE = "azure_llm_2023_conv.csv"
MOONCAKE = "mooncake_conversation.jsonl"
WINDOW_S = {AZURE: 1200.0, MOONCAKE: 600.0}

BASE = {"model_spec": "llama-1b", "block_size": 16, "num_gpu_blocks": 16384, "max_model_len": 16384}
PAGED = {"vllm_compat": "0.8"}
"""The recorded runs drove paged-kv as it modelled vLLM before the 2026 presets (prefix
caching only where a cell asks, first-chunk admission, no async scheduling)."""


def _cell(name, policy, params, trace, rate_rps, requests):
    return {"name": name, "policy": policy, "params": BASE | params, "trace": trace,
            "rate_rps": float(rate_rps), "requests": int(requests)}


CELLS = [
    _cell("paged-light", "paged-kv", PAGED, AZURE, 4.0, 150),
    _cell("paged-medium", "paged-kv", PAGED, AZURE, 10.0, 300),
    _cell("paged-near", "paged-kv", PAGED, AZURE, 19.0, 450),
    _cell("paged-prefix-medium", "paged-kv", PAGED | {"enable_prefix_caching": True}, AZURE, 10.0, 300),
    _cell("paged-preempt-medium", "paged-kv", PAGED | {"num_gpu_blocks": 1500}, AZURE, 9.0, 270),
    _cell("continuous-max-medium", "continuous", {"reservation": "max"}, AZURE, 7.0, 200),
    _cell("static-b8-medium", "static", {"batch_size": 8, "reservation": "max"}, AZURE, 2.5, 80),
    _cell("mooncake-prefix", "paged-kv", PAGED | {"enable_prefix_caching": True, "max_model_len": 32768},
          MOONCAKE, 1.5, 50),
    _cell("continuous-max-near", "continuous", {"reservation": "max"}, AZURE, 10.0, 300),
]
"""In the order the device runs them (the cheapest first, so a cut budget loses the last)."""


def policy_name(cell: dict) -> str:
    """The plugin name (``static`` on a token trace is ``llm-static``)."""
    return "llm-static" if cell["policy"] == "static" else cell["policy"]


def cli_flags(cell: dict) -> list[str]:
    """The cell's policy flags as ``schedsim run`` / ``schedsim live`` take them."""
    out = ["--policy", cell["policy"]]
    for k, v in cell["params"].items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        else:
            out += [flag, str(v)]
    return out
