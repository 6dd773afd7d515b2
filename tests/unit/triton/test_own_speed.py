"""experiments/triton/own_speed.py: a table corrected by a server's measured batch costs."""

import importlib.util
import sys

import numpy as np

from cli_helpers import ROOT
from schedsim.cost.profile import load_profile

PROFILE = ROOT / "profiles" / "bert-base-fp16-triton-http-h200.csv"


def _module():
    sys.path.insert(0, str(ROOT / "experiments" / "triton"))
    try:
        spec = importlib.util.spec_from_file_location("own_speed", ROOT / "experiments" / "triton" / "own_speed.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "experiments" / "triton"))


def test_scaled_and_shifted_tables(tmp_path):
    own = _module()
    base = load_profile(PROFILE)
    scaled = load_profile(own.corrected_profile(PROFILE, tmp_path / "scaled", factor=1.25))
    shifted = load_profile(own.corrected_profile(PROFILE, tmp_path / "shifted", extra_ms=0.3))
    np.testing.assert_allclose(scaled.table["latency_ms_mean"], 1.25 * base.table["latency_ms_mean"])
    np.testing.assert_allclose(shifted.table["latency_ms_mean"], base.table["latency_ms_mean"] + 0.3)
    np.testing.assert_allclose(shifted.table["latency_ms_std"], base.table["latency_ms_std"])
    for key, samples in base.samples.items():
        np.testing.assert_allclose(scaled.samples[key], 1.25 * samples)
        np.testing.assert_allclose(shifted.samples[key], samples + 0.3)
    assert "host_variation" not in scaled.meta  # the corrected table is the server's: no host record on top
