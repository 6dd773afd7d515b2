"""The LLM model against the live H200 runs 7 and 9 of experiments/fidelity-llm/.

The live side is a measurement and never changes; the simulated side is this checkout's
simulator, policies and bundled step profile. So these fail when a change to any of them
moves the predictions away from what the engine did. Bounds sit a little above what the
model scored (README there): request-latency median abs error 4.9% on run 7, decode
(graph) steps -5..+3% and eager steps -7..+14% at the median per cell on runs 7 and 9,
Mooncake's eager steps -16% and -17%.

The runs are cut into tests/data/fidelity_llm/ (the whole runs are listed in
experiments/RUNS.md): every step of each cell's live_steps.csv with the columns the step
model prices (start_s and gpu_ms rounded to the microsecond: only the host-gap figure
reads them), and run 7's results with their per-request arrays (result.npz without its
step and inter-token arrays, which no figure here reads). Every figure these tests assert
comes out of the cut files as it did out of the whole runs.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments" / "fidelity-llm"
DATA = ROOT / "tests" / "data" / "fidelity_llm"
RUN = DATA / "run7"


def _analyze_module():
    spec = importlib.util.spec_from_file_location("fidelity_llm_analyze", HERE / "analyze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def analyze():
    return _analyze_module()


@pytest.mark.parametrize("run", ["run7", "run9"])
@pytest.mark.parametrize("cell", ["paged-light", "paged-medium", "paged-near", "paged-prefix-medium",
                                  "paged-preempt-medium", "continuous-max-medium", "continuous-max-near",
                                  "static-b8-medium", "mooncake-prefix"])
def test_the_step_model_prices_the_logged_live_steps(analyze, run, cell):
    out = analyze.step_errors(DATA / run / "cells" / cell / "live_steps.csv")   # read from the .csv.gz
    assert out["step_graph_n"] > 1000
    assert abs(out["step_graph_err_p50_pct"]) <= 6.0
    # Eager steps: within 15% at the median; Mooncake's 8,192-token chunks beside long
    # decodes are the known miss (-21% before the serial-keys term, -16% and -17% after).
    assert abs(out["step_eager_err_p50_pct"]) <= (20.0 if cell == "mooncake-prefix" else 15.0)


def test_request_latency_predictions_hold_on_run7(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "analyze.py"), "--run", str(RUN), "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cells"] == 9
    assert summary["latency_abs_err_pct_median"] <= 5.5
    import pandas as pd

    table = pd.read_csv(tmp_path / "fidelity_llm.csv")
    for metric in ("tpot_p50", "e2e_p50"):
        assert table[f"{metric}_err_pct"].abs().median() <= 5.0, metric
    assert (table["throughput_err_pct"].abs() <= 4.0).all()
