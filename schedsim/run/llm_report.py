"""Writing an LLM run's outputs: requests.csv, steps.csv, plots, then summary.json.

As :mod:`schedsim.run.report`: every file goes to a temporary name and is renamed into
place, and summary.json is written last, so an interrupted run never leaves a
directory that looks complete.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from schedsim.core.llm_results import LLMResult
from schedsim.core.results import COMPLETED, STATUS_NAMES
from schedsim.files import write_atomically
from schedsim.run.report import write_run_dir


def _masked(values, mask) -> pa.Array:
    return pa.array(values, mask=~mask)


def request_table(result: LLMResult, request_id: np.ndarray) -> pa.Table:
    """Row = request; times in seconds, latencies in ms, nulls for 'did not happen'."""
    req = result.requests
    arrival = req.arrival_ns
    scheduled = result.scheduled_ns >= 0
    first = result.first_token_ns >= 0
    ended = result.end_ns >= 0  # the last token, or the rejection
    done = result.status == COMPLETED
    multi = done & (result.tokens_out > 1)
    ttft_ms = (result.first_token_ns - arrival) / 1e6
    e2e_ms = (result.end_ns - arrival) / 1e6
    tpot_ms = (e2e_ms - ttft_ms) / np.maximum(result.tokens_out.astype(np.int64) - 1, 1)
    return pa.table({
        "request_id": request_id,
        "arrival_s": arrival / 1e9,
        "scheduled_s": _masked(result.scheduled_ns / 1e9, scheduled),
        "first_token_s": _masked(result.first_token_ns / 1e9, first),
        "end_s": _masked(result.end_ns / 1e9, ended),
        "ttft_ms": _masked(ttft_ms, first),
        "tpot_ms": _masked(tpot_ms, multi),
        "e2e_ms": _masked(e2e_ms, done),
        "input_tokens": req.input_tokens,
        "output_tokens": req.output_tokens,
        "tokens_out": result.tokens_out,
        "preemptions": result.preemptions,
        "prefix_hit_tokens": _masked(result.prefix_hit_tokens, scheduled),
        "status": pa.DictionaryArray.from_arrays(pa.array(result.status.astype(np.int32)),
                                                 pa.array(STATUS_NAMES)),
    })


def step_table(result: LLMResult) -> pa.Table:
    """The step log, one row per record (``repeats`` identical steps)."""
    return pa.table({
        "start_s": result.step_start_ns / 1e9,
        "end_s": result.step_end_ns / 1e9,
        "repeats": result.step_repeats,
        "seqs": result.step_seqs,
        "tokens": result.step_tokens,
        "prefill_tokens": result.step_prefill_tokens,
        "kv_blocks": result.step_kv_blocks,
        "waiting": result.step_waiting,
        "preempted": result.step_preempted,
    })


def write_llm_outputs(out_dir: Path, result: LLMResult, request_id: np.ndarray, summary: dict,
                      plot: bool = False, warmup_s: float = 0.0) -> list[Path]:
    """Write DIR/requests.csv, DIR/steps.csv, optional plots, then DIR/summary.json."""
    def plots(out_dir):
        from schedsim.run.llm_plots import write_llm_plots  # lazy: matplotlib only when asked for

        return write_llm_plots(out_dir, result, warmup_s, write_atomically, summary)

    tables = [("requests.csv", request_table(result, request_id)), ("steps.csv", step_table(result))]
    return write_run_dir(out_dir, tables, summary, plots if plot else None)
