"""PNG plots of an LLM run: running requests, KV blocks and waiting requests over time; TTFT, TPOT and E2E CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt
import numpy as np

from schedsim.core.llm_results import LLMResult
from schedsim.core.results import COMPLETED
from schedsim.run.plots import draw_band, figure_saver


def step_series(start_ns: np.ndarray, end_ns: np.ndarray, values: np.ndarray,
                idle: float | None = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(t_s, value) for ``ax.step(where="post")``: each record's value from its start;
    ``idle`` from its end when the next record starts later (None: hold the value)."""
    start_ns, end_ns = np.asarray(start_ns), np.asarray(end_ns)
    values = np.asarray(values, dtype=np.float64)
    if not start_ns.size:
        return np.empty(0), np.empty(0)
    if idle is None:
        return np.append(start_ns, end_ns[-1]) / 1e9, np.append(values, values[-1])
    gap = np.append(end_ns[:-1] < start_ns[1:], True)  # the last record ends in idle
    t = np.empty(start_ns.size + gap.sum(), dtype=np.int64)
    v = np.empty(t.size)
    at = np.arange(start_ns.size) + np.concatenate([[0], np.cumsum(gap)[:-1]])
    t[at], v[at] = start_ns, values
    t[at[gap] + 1], v[at[gap] + 1] = end_ns[gap], idle
    return t / 1e9, v


def write_llm_plots(out_dir: Path, result: LLMResult, warmup_s: float, atomic, summary: dict | None = None) -> list[Path]:
    """The run's PNGs; with a ``summary`` that has a band, the CDFs shade the p50 and p99 bands."""
    paths = []
    save = figure_saver(out_dir, atomic, paths)

    start, end = result.step_start_ns, result.step_end_ns
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    kv_label = "KV blocks in use"
    if result.kv_blocks_total:
        kv_label += f" (of {result.kv_blocks_total})"
    for ax, values, idle, label in ((axes[0], result.step_seqs, 0.0, "running requests"),
                                    (axes[1], result.step_kv_blocks, None, kv_label),
                                    (axes[2], result.step_waiting, None, "waiting requests")):
        t, v = step_series(start, end, values, idle)
        ax.step(t, v, where="post", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if warmup_s > 0:
            ax.axvline(warmup_s, ls=":", color="grey")
    if result.kv_blocks_total:
        axes[1].axhline(result.kv_blocks_total, ls="--", color="red", lw=0.8)
    axes[-1].set_xlabel("time (s)")
    axes[0].set_title("Engine steps")
    fig.tight_layout()
    save(fig, "timeline.png")

    req = result.requests
    done = (req.arrival_ns >= int(round(warmup_s * 1e9))) & (result.status == COMPLETED)
    ttft_ms = (result.first_token_ns - req.arrival_ns) / 1e6
    e2e_ms = (result.end_ns - req.arrival_ns) / 1e6
    multi = done & (result.tokens_out > 1)   # TPOT as requests.csv and the summary have it
    tpot_ms = (e2e_ms - ttft_ms)[multi] / (result.tokens_out[multi].astype(np.int64) - 1)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, values, name, key in ((axes[0], ttft_ms[done], "TTFT", "ttft"), (axes[1], tpot_ms, "TPOT", "tpot"),
                                  (axes[2], e2e_ms[done], "E2E latency", "e2e")):
        ms = np.sort(values)
        if ms.size:
            # Empirical CDF as a step from 0, so that even one request shows.
            ax.step(np.r_[ms[0], ms], np.arange(ms.size + 1) / ms.size, where="post")
            for q in (50, 99):
                ax.axvline(np.percentile(ms, q), ls=":", color="grey")
        draw_band(ax, summary, (f"{key}_p50_ms", f"{key}_p99_ms"))
        ax.set(xlabel=f"{name} (ms)", ylabel="fraction of requests", title=f"{name} CDF")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, "latency_cdf.png")
    return paths
