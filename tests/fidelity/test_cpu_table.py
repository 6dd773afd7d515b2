"""The reduced CPU fidelity table (experiments/fidelity-cpu/) as a test: the simulator's
predictions hold within wide tolerances, and a 30% cost error is caught."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "fidelity-cpu" / "fidelity_cpu.py"


def _module():
    spec = importlib.util.spec_from_file_location("fidelity_cpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_fidelity_holds_and_a_30pct_cost_error_fails(tmp_path):
    fid = _module()
    table = fid.run(tmp_path, duration_s=3.0, warmup_s=0.5, cost_scales=(1.0, 1.3), min_iters=40,
                    min_time_s=0.03, replications=2)
    honest, wrong = table[table.cost_scale == 1.0], table[table.cost_scale == 1.3]
    assert honest["ok"].all(), honest.to_string()
    assert not wrong["ok"].all(), wrong.to_string()
    # The loaded cells tell a 30% error apart from the truth in the right direction.
    for cell in ("none-60", "dynamic-d0-50"):
        h = honest[honest.cell == cell].iloc[0]
        w = wrong[wrong.cell == cell].iloc[0]
        assert w["mean_err_pct"] > h["mean_err_pct"] + 30
    assert (tmp_path / "fidelity_cpu.csv").is_file()
