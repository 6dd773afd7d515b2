"""Files of ``schedsim autoscale``: autoscale.json, scaling_log.csv and autoscale.png."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schedsim.files import replaced_atomically, write_json


def write_autoscale_outputs(out: Path, result: dict, timeline, auto) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "scaling_log.csv"
    with replaced_atomically(path) as tmp:
        lines = ["time_s,action,replica,active"] + [
            f"{e['time_s']!r},{e['action']},{e['replica']},{e['active']}" for e in result["scaling_log"]]
        tmp.write_text("\n".join(lines) + "\n")
    written.append(path)
    written.append(_plot(out / "autoscale.png", timeline, auto, result["slo_latency_ms"]))
    path = out / "autoscale.json"
    write_json(path, result)  # last: a directory without it is not a finished run
    written.append(path)
    return written


def _plot(path: Path, timeline, auto, slo_ms: float) -> Path:
    import matplotlib  # lazy: matplotlib costs about a second of start-up; only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib costs about a second of start-up; only plots need it

    arrival_ns, log, initial, latency_ms, done = timeline
    t = arrival_ns / 1e9
    step = max(auto.interval_s, (t[-1] - t[0]) / 200 if t.size else 1.0)
    edges = np.arange(t[0] if t.size else 0.0, (t[-1] if t.size else 0.0) + step, step)
    counts, _ = np.histogram(t, edges)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(edges[:-1], counts / step, color="tab:grey", lw=0.8, label="arrivals (req/s)")
    ax1.set_ylabel("requests/s")
    ax1b = ax1.twinx()
    times, active = [t[0] if t.size else 0.0], [initial]
    for when_ns, action, _r, k in log:
        if action in ("ready", "remove"):
            times.append(when_ns / 1e9)
            active.append(k)
    times.append(t[-1] if t.size else 0.0)
    active.append(active[-1])
    ax1b.step(times, active, where="post", color="tab:blue", label="routable replicas")
    ax1b.set_ylabel("replicas")
    ax1.set_title("Load and replicas")
    within = np.full(counts.shape, np.nan)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max(len(counts) - 1, 0))
    if counts.size:
        ok = done & (latency_ms <= slo_ms)
        within = np.bincount(idx, weights=ok, minlength=len(counts)) / np.maximum(
            np.bincount(idx, minlength=len(counts)), 1)
    ax2.plot(edges[:-1], within * 100, color="tab:green")
    ax2.set(xlabel="time (s)", ylabel=f"% within {slo_ms:g} ms", ylim=(-2, 102))
    ax2.grid(alpha=0.3)
    with replaced_atomically(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
