"""experiments/triton/server_record.py: servers' measured speeds as a between-server host
record that the band replays one server per replication."""

import importlib.util
import json

import numpy as np
import pytest

from cli_helpers import ROOT
from schedsim.run.bands import HostTimeline

RESULTS = ROOT / "experiments" / "triton" / "results"
SPEEDS = sorted(RESULTS.glob("server_speed_h200_m*.csv"))


def _module():
    spec = importlib.util.spec_from_file_location("server_record", ROOT / "experiments" / "triton" / "server_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def server_record():
    if not SPEEDS:
        pytest.skip("no server_speed results in the tree")
    return _module()


def test_one_round_per_server_at_its_level(server_record):
    factors = server_record.server_factors(SPEEDS)
    rec = server_record.server_record(factors)
    assert rec["rounds"] == len(factors) == len(rec["window_factors"]) and rec["rounds_are"] == "servers"
    timeline = HostTimeline.from_meta({"host_variation": rec})
    assert timeline.stay_in_round
    rng = np.random.default_rng(0)
    for _ in range(20):  # a replication runs the whole trace at one server's speed
        path = timeline.draw(rng, 0, span_s=7.0)
        assert np.unique(path.slowdown).size == 1
        assert np.isclose(rec["round_factors"], path.slowdown[0], atol=1e-5).any()


def test_within_run_windows_keep_each_servers_level(server_record, tmp_path):
    own = {"host_variation": {"window_s": 0.25, "within_run_cv": 0.05,
                              "window_factors": [[0.9, 1.1, 1.0, 1.2], [1.05, 0.95]]}}
    (tmp_path / "own.json").write_text(json.dumps(own))
    out = tmp_path / "rec.json"
    assert server_record.main(["--speeds", *map(str, SPEEDS), "--within", str(tmp_path / "own.json"),
                               "--out", str(out)]) == 0
    rec = json.loads(out.read_text())["host_variation"]
    timeline = HostTimeline.from_meta({"host_variation": rec})
    for windows, level in zip(timeline.rounds, rec["round_factors"]):
        assert windows.mean() == pytest.approx(level, rel=1e-4)
    assert timeline.window_s == 0.25 and rec["within_run_cv"] == 0.05
