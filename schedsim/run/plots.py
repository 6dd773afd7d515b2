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


def write_plots(out_dir: Path, result: SimResult, warmup_s: float, atomic) -> list[Path]:
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
