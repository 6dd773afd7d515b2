"""The cells of the H200 fidelity table, shared by run_h200.py (device) and analyze.py (here).

Load is a fraction of the policy's capacity on one GPU, from the committed profile
(profiles/bert-base-fp16-cg-h200.csv, plus its dispatch overhead): none serves 1 sample
per batch, static its batch size, dynamic up to max_batch_size 64. Two instances share
one GPU, so their capacity is the GPU's, not twice it. Imports only the standard library.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

DISPATCH_US = 44.1  # the committed profile's dispatch_overhead_us


def _cell(name, policy, params, load, *, instances=1, cv=1.0, spin_us=0.0):
    return {"name": name, "policy": policy, "params": params, "load": load, "instances": instances,
            "cv": cv, "spin_us": spin_us, "seed": 1000 + len(_names), "arrival": "poisson" if cv == 1 else f"gamma-cv{cv:g}"}


_names: list[str] = []


def _add(cells, *args, **kw):
    c = _cell(*args, **kw)
    _names.append(c["name"])
    cells.append(c)


def _build() -> list[dict]:
    cells: list[dict] = []
    d = lambda delay, pref=None: {"max_batch_size": 64, "max_queue_delay_us": delay,  # noqa: E731
                                  **({"preferred_batch_sizes": pref} if pref else {})}
    for load in (0.1, 0.3, 0.5, 0.7, 0.9):
        _add(cells, f"none-poisson-{load:.0%}", "none", {}, load)
    for load in (0.3, 0.7):
        _add(cells, f"none-gamma3-{load:.0%}", "none", {}, load, cv=3.0)
    for load in (0.1, 0.5, 0.9):
        _add(cells, f"static8-w1000-poisson-{load:.0%}", "static", {"batch_size": 8, "max_wait_us": 1000}, load)
    for load in (0.05, 0.25, 0.5, 0.75, 0.9):
        _add(cells, f"dyn-d0-poisson-{load:.0%}", "dynamic", d(0), load)
    for load in (0.25, 0.5, 0.75, 0.9):
        _add(cells, f"dyn-d100-poisson-{load:.0%}", "dynamic", d(100), load)
    for load in (0.1, 0.5, 0.9):
        _add(cells, f"dyn-d500-poisson-{load:.0%}", "dynamic", d(500), load)
    for load in (0.1, 0.5):
        _add(cells, f"dyn-d2000-poisson-{load:.0%}", "dynamic", d(2000), load)
    for load in (0.25, 0.5, 0.9):
        _add(cells, f"dyn-d500-pref-poisson-{load:.0%}", "dynamic", d(500, [16, 32, 64]), load)
    for load in (0.25, 0.5, 0.75):
        _add(cells, f"dyn-d100-gamma3-{load:.0%}", "dynamic", d(100), load, cv=3.0)
    _add(cells, "dyn-d500-pref-gamma3-50%", "dynamic", d(500, [16, 32, 64]), 0.5, cv=3.0)
    for load in (0.25, 0.5, 0.75, 0.9):
        _add(cells, f"dyn-d100-2inst-poisson-{load:.0%}", "dynamic", d(100), load, instances=2)
    _add(cells, "dyn-d100-2inst-gamma3-50%", "dynamic", d(100), 0.5, instances=2, cv=3.0)
    # Three instances: the pair grid's rule for several co-runners, live.
    for load in (0.25, 0.5, 0.75):
        _add(cells, f"dyn-d100-3inst-poisson-{load:.0%}", "dynamic", d(100), load, instances=3)
    # The dispatcher's busy-wait (150 us before each timed wake-up): the same cells with it.
    _add(cells, "spin-none-poisson-50%", "none", {}, 0.5, spin_us=150.0)
    _add(cells, "spin-dyn-d100-poisson-50%", "dynamic", d(100), 0.5, spin_us=150.0)
    return cells


CELLS = _build()


def committed_profile_means(path) -> dict[int, float]:
    """batch -> mean service time in s (table mean + dispatch overhead) of a profile CSV."""
    side = Path(path).with_suffix(".json")
    overhead_us = json.loads(side.read_text()).get("dispatch_overhead_us", DISPATCH_US) if side.exists() else DISPATCH_US
    with open(path) as f:
        return {int(r["batch"]): float(r["latency_ms_mean"]) / 1e3 + overhead_us / 1e6 for r in csv.DictReader(f)}


def capacity_rps(cell: dict, means: dict[int, float]) -> float:
    """Requests per second the GPU can take under the cell's policy (one sample each)."""
    b = {"none": 1, "static": cell["params"].get("batch_size", 8)}.get(cell["policy"],
                                                                      cell["params"].get("max_batch_size", 64))
    return b / means[b]
