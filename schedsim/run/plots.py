"""PNG plots of a run: latency CDF, batch-size histogram, queue length over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt
import numpy as np

from schedsim.core.metrics import measured_rows, queue_length
from schedsim.core.results import COMPLETED, SimResult


def figure_saver(out_dir: Path, atomic, paths: list):
    """``save(fig, name)``: write ``fig`` as DIR/name (PNG) with ``atomic``, close it, list the path."""
    def save(fig, name):
        path = out_dir / name
        atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
        plt.close(fig)
        paths.append(path)

    return save


def draw_band(ax, summary: dict | None, keys: tuple[str, ...]) -> None:
    """Shade each ``key``'s prediction band (``KEY_lo``..``KEY_hi`` in ``summary``) across ``ax``,
    with its level in the legend: the range one live run's figure lands in."""
    band = (summary or {}).get("band")
    shown = False
    for key in keys:
        lo, hi = (summary or {}).get(f"{key}_lo"), (summary or {}).get(f"{key}_hi")
        if lo is None or hi is None:
            continue
        label = None if shown else f"{band['level']:.0%} band of one live run ({band['replications']} replications)"
        ax.axvspan(lo, hi, color="tab:orange", alpha=0.25, lw=0, label=label)
        shown = True
    if shown:
        ax.legend(loc="lower right", fontsize=8)


def write_plots(out_dir: Path, result: SimResult, warmup_s: float, atomic, summary: dict | None = None) -> list[Path]:
    """The run's PNGs; with a ``summary`` that has a band, the latency CDF shades the p50 and p99 bands."""
    req = result.requests
    done = measured_rows(result, warmup_s) & (result.status == COMPLETED)
    latency_ms = np.sort((result.end_ns[done] - req.arrival_ns[done]) / 1e6)
    paths = []
    save = figure_saver(out_dir, atomic, paths)

    fig, ax = plt.subplots(figsize=(6, 4))
    if latency_ms.size:
        ax.plot(latency_ms, np.arange(1, latency_ms.size + 1) / latency_ms.size)
        for q in (50, 99):
            ax.axvline(np.percentile(latency_ms, q), ls=":", color="grey")
    draw_band(ax, summary, ("p50_ms", "p99_ms"))
    ax.set(xlabel="latency (ms)", ylabel="fraction of requests", title="Latency CDF")
    ax.grid(alpha=0.3)
    save(fig, "latency_cdf.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes, counts = np.unique(result.batch_samples, return_counts=True)
    ax.bar(sizes, counts, width=0.8)
    ax.set(xlabel="batch size (samples)", ylabel="batches", title="Batch sizes")
    save(fig, "batch_size_hist.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    t, length = queue_length(result)
    ax.step(t, length, where="post", lw=0.8)
    ax.set(xlabel="time (s)", ylabel="requests waiting", title="Queue length")
    save(fig, "queue_length.png")
    return paths
