"""PNG plots of a sweep: p99 and throughput against each swept number, and the Pareto front."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt

from schedsim.files import replaced_atomically


def _save(fig, path: Path) -> Path:
    with replaced_atomically(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


def _number(text: str):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def write_sweep_plots(out: Path, rows: list[dict], spec, front: list[int]) -> list[Path]:
    """One ``vs_NAME.png`` per numeric grid name (a line per setting of the other names, each
    p99 with its prediction band where the sweep computed one), and ``pareto.png``
    (throughput against p99, the front joined, the SLO drawn)."""
    written = []
    names = list(spec.grid)
    slo_p99 = [c.limit for c in spec.slo if c.key == "p99_ms" and c.op[0] == "<"]
    for name in names:
        if not all(_number(r[name]) is not None for r in rows):
            continue
        others = [n for n in names if n != name]
        groups: dict[tuple, list] = {}
        for r in sorted(rows, key=lambda r: r["cell"]):
            groups.setdefault(tuple(r[n] for n in others), []).append(r)
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
        for key, group in groups.items():
            group.sort(key=lambda r: _number(r[name]))
            x = [_number(r[name]) for r in group]
            text = ", ".join(f"{n}={v}" for n, v in zip(others, key)) or None
            line, = ax1.plot(x, [r.get("p99_ms") for r in group], marker=".", label=text)
            banded = [(xi, r["p99_ms_lo"], r["p99_ms_hi"]) for xi, r in zip(x, group)
                      if _finite(_number(r.get("p99_ms_lo"))) and _finite(_number(r.get("p99_ms_hi")))]
            if banded:  # the prediction band where the sweep computed one (cells meeting the SLO)
                bx, lo, hi = zip(*banded)
                ax1.vlines(bx, [float(v) for v in lo], [float(v) for v in hi], color=line.get_color(), alpha=0.5, lw=3)
            ax2.plot(x, [r.get("throughput_rps") for r in group], marker=".", label=text)
        for limit in slo_p99:
            ax1.axhline(limit, ls="--", color="red", lw=1, label=f"SLO p99 {limit:g} ms")
        ax1.set(ylabel="p99 latency (ms)", title=f"p99 and throughput against {name}")
        ax2.set(xlabel=name, ylabel="throughput (req/s)")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
        if len(groups) > 1 or slo_p99:
            ax1.legend(fontsize=7)
        written.append(_save(fig, out / f"vs_{name}.png"))

    fig, ax = plt.subplots(figsize=(6, 4.5))
    pts = [r for r in rows if _finite(r.get("p99_ms")) and _finite(r.get("throughput_rps"))]
    ax.scatter([r["p99_ms"] for r in pts], [r["throughput_rps"] for r in pts], s=12,
               c=["tab:green" if r["meets_slo"] else "tab:grey" for r in pts])
    f = [rows[i] for i in front]
    ax.plot([r["p99_ms"] for r in f], [r["throughput_rps"] for r in f], color="tab:blue",
            drawstyle="steps-post", label="Pareto front")
    for limit in slo_p99:
        ax.axvline(limit, ls="--", color="red", lw=1, label=f"SLO p99 {limit:g} ms")
    ax.set(xlabel="p99 latency (ms)", ylabel="throughput (req/s)",
           title="Throughput against p99 (green: meets the SLO)")
    if pts and max(r["p99_ms"] for r in pts) > 20 * max(min(r["p99_ms"] for r in pts), 1e-9):
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    written.append(_save(fig, out / "pareto.png"))
    return written
