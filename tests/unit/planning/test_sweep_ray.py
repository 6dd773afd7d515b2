"""A sweep on a local Ray instance gives the same files as the local executor."""

from __future__ import annotations

import pytest

from schedsim.planning.grid import parse_grid
from schedsim.planning.objective import parse_objective, parse_slo
from schedsim.run.runner import RunSpec
from schedsim.planning.sweep import SweepSpec, run_sweep
from cli_helpers import ROOT

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def test_ray_and_local_sweeps_write_the_same_bytes(local_ray, tmp_path):
    slo = parse_slo([], p99_ms=3)
    spec = SweepSpec(base=RunSpec(trace=ROOT / "traces" / "poisson_2000rps.csv", rate_scale=4.0, seed=3,
                                  replications=2),
                     grid=parse_grid(["max_queue_delay_us=0,1000,3000", "preferred_batch_size=none,8/16/32"]),
                     slo=slo, objective=parse_objective("max:throughput_rps", 0.01, slo), plot=False)
    outs = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        run_sweep(SweepSpec(**{**vars(spec), "executor": executor, "workers": 1 if executor == "local" else 2,
                               "out": out}))
        outs[executor] = out
    for name in ("sweep.csv", "best.json"):
        assert (outs["local"] / name).read_bytes() == (outs["ray"] / name).read_bytes()
    assert "p99_ms_ci_lo" in (outs["ray"] / "sweep.csv").read_text().splitlines()[0]
