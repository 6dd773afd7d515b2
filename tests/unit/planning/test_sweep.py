"""``schedsim sweep`` and ``schedsim plan`` in a subprocess, and their pieces in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from schedsim.errors import InputError
from schedsim.planning.grid import cells, parse_grid
from schedsim.planning.objective import Objective, parse_slo, rank
from cli_helpers import ROOT, assert_one_line_error, schedsim

TRACE = ROOT / "traces" / "poisson_2000rps.csv"
GRID = ["--grid", "max_queue_delay_us=0:6000:3000", "--grid", "preferred_batch_size=none,8/16/32"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """5,000 requests of the bundled trace, replayed 4x faster (8,000 req/s)."""
    path = tmp_path_factory.mktemp("sweep") / "t.csv"
    path.write_text("".join(TRACE.read_text().splitlines(keepends=True)[:5001]))
    return path


@pytest.fixture(scope="module")
def swept(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("swept")
    runs = {}
    for name, workers in (("pool", "2"), ("inline", "1")):
        proc = schedsim("sweep", trace, *GRID, "--rate-scale", "4", "--slo-p99-ms", "3",
                        "--workers", workers, "--out", out / name)
        assert proc.returncode == 0, proc.stderr
        runs[name] = (proc, out / name)
    return runs


def test_grid_syntax():
    grid = parse_grid(["max-queue-delay-us=0:1000:500", "preferred_batch_size=none,8,8/16/32",
                       "prefetch=true,false", "instances=1,2"])
    assert grid == {"max_queue_delay_us": [0, 500, 1000], "preferred_batch_sizes": [(), (8,), (8, 16, 32)],
                    "prefetch": [True, False], "instances": [1, 2]}
    assert len(cells(grid)) == 36
    assert cells(grid)[1] == {"max_queue_delay_us": 0, "preferred_batch_sizes": (), "prefetch": True, "instances": 2}
    assert parse_grid(["rate_scale=0.5:1.0:0.25"])["rate_scale"] == [0.5, 0.75, 1.0]


@pytest.mark.parametrize("items, needle", [
    ([], "--grid: give at least one"), (["max_queue_delay_us"], "expected name="),
    (["max_queue_delay_us="], "no values"), (["max_queue_delay_us=5:1:1"], "start <= stop"),
    (["max_queue_delay_us=0:10"], "start:stop:step"), (["a=1,1"], "repeated"),
    (["a=1", "a=2"], "given twice"), (["instances=0,1"], "numbers > 0"), (["a=1,,2"], "empty value"),
])
def test_bad_grids(items, needle):
    with pytest.raises(InputError, match=needle):
        parse_grid(items)


def test_slo_and_ranking():
    slo = parse_slo(["throughput_rps>=100"], p99_ms=10)
    assert [str(c) for c in slo] == ["p99_ms<=10", "throughput_rps>=100"]
    rows = [{"cell": 0, "p99_ms": 12.0, "throughput_rps": 500.0},   # misses by 20%
            {"cell": 1, "p99_ms": 9.0, "throughput_rps": 499.0},    # ties on throughput (1%)
            {"cell": 2, "p99_ms": 5.0, "throughput_rps": 498.0},    # ... with a lower p99
            {"cell": 3, "p99_ms": 2.0, "throughput_rps": 300.0},    # meets, much less throughput
            {"cell": 4, "p99_ms": 30.0, "throughput_rps": 90.0}]    # misses by 200%
    assert rank(rows, slo, Objective()) == [2, 1, 3, 0, 4]
    for bad in (["p99_ms=<5"], ["p99_ms<=x"], ["<=5"]):
        with pytest.raises(InputError, match="--slo"):
            parse_slo(bad)


def test_sweep_writes_ranked_table_best_and_plots(swept):
    proc, out = swept["pool"]
    assert "best setting meeting the SLO" in proc.stdout
    lines = (out / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("cell,max_queue_delay_us,preferred_batch_sizes,meets_slo,slo_margin,throughput_rps")
    assert len(lines) == 7 and len((out / "cells.csv").read_text().splitlines()) == 7
    best = json.loads((out / "best.json").read_text())
    assert best["complete"] and best["cells_done"] == 6 and best["best"]["meets_slo"]
    assert best["best"]["slo_margins"][0]["margin"] > 0
    for png in ("vs_max_queue_delay_us.png", "pareto.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_sweep_same_bytes_with_a_pool_and_inline(swept):
    for name in ("sweep.csv", "best.json"):
        assert (swept["pool"][1] / name).read_bytes() == (swept["inline"][1] / name).read_bytes()


def test_recommended_setting_meets_the_slo_when_run_on_its_own(swept, trace):
    proc, out = swept["pool"]
    best = json.loads((out / "best.json").read_text())["best"]
    command = next(line for line in proc.stdout.splitlines() if line.startswith("reproduce: "))
    args = command.removeprefix("reproduce: schedsim ").split()
    assert "--max-queue-delay-us" in args and "--rate-scale" in args
    run = schedsim(*args, "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["p99_ms"] <= 3
    assert summary["p99_ms"] == best["metrics"]["p99_ms"]  # the same run, bit for bit


def test_unmeetable_slo_shows_the_closest_and_exits_2(trace, tmp_path):
    proc = schedsim("sweep", trace, *GRID, "--rate-scale", "4", "--slo-p99-ms", "0.5", "--workers", "1",
                    "--out", tmp_path)
    assert_one_line_error(proc, "--slo: no setting meets p99_ms<=0.5", "closest: max_queue_delay_us=")
    assert "no setting meets the SLO; closest" in proc.stdout
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["best"] is None and best["closest"]["meets_slo"] is False


@pytest.mark.parametrize("args, needle", [
    ((), "--grid: give at least one"),
    (("--grid", "max_queue_delay_us"), "--grid 'max_queue_delay_us'"),
    (("--grid", "bogus=1,2"), "unknown parameter 'bogus'"),
    (("--grid", "max_queue_delay_us=-5,0"), "max_queue_delay_us"),
    (("--grid", "max_queue_delay_us=0,1", "--slo", "p99<5"), "--slo/--objective: summary.json has no numeric metric 'p99'"),
    (("--grid", "max_queue_delay_us=0,1", "--executor", "ray", "--ray-address", "127.0.0.1:9"), "--ray-address: cannot reach"),
    (("--grid", "max_queue_delay_us=0,1", "--executor", "slurm"), "--executor"),
])
def test_sweep_bad_input_is_one_line(trace, args, needle):
    assert_one_line_error(schedsim("sweep", trace, "--workers", "1", *args), needle)


def test_interrupted_sweep_keeps_finished_cells(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "schedsim.cli.main", "sweep", str(TRACE), "--grid",
                             "max_queue_delay_us=0:40000:500", "--workers", "1", "--out", str(tmp_path)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cells_csv = tmp_path / "cells.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cells_csv.exists() and len(cells_csv.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["complete"] is False and 2 <= best["cells_done"] < best["cells_total"] == 81
    assert len((tmp_path / "sweep.csv").read_text().splitlines()) == best["cells_done"] + 1


# --- plan -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A plan judged on the point estimate (--slo-confidence 0)."""
    out = tmp_path_factory.mktemp("plan")
    proc = schedsim("plan", "--qps", "20000", "--slo-p99-ms", "5", "--requests", "6000",
                    "--grid", "max_queue_delay_us=0,1000", "--gpu-cost-per-hour", "2.5", "--out", out,
                    "--slo-confidence", "0")
    assert proc.returncode == 0, proc.stderr
    return proc, out, json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def planned_on_band(tmp_path_factory):
    """The same plan judged on the prediction band (the default)."""
    out = tmp_path_factory.mktemp("plan-band")
    proc = schedsim("plan", "--qps", "20000", "--slo-p99-ms", "5", "--requests", "6000",
                    "--grid", "max_queue_delay_us=0,1000", "--gpu-cost-per-hour", "2.5", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return proc, out, json.loads((out / "plan.json").read_text())


def test_plan_on_the_band_is_minimal_on_the_band_and_never_below_the_point_plan(planned, planned_on_band):
    """Run the band plan's setting alone on N and N-1 replicas with the band the plan used
    (arrivals redrawn: the trace was generated): the band's upper edge meets the SLO on N and
    misses it on N-1; it needs at least as many replicas as the point plan."""
    _, out, plan = planned_on_band
    assert plan["slo_confidence"] == 0.95 and "90% prediction band" in plan["slo_judged_on"]
    assert "not in the band: the host's speed" in plan["slo_judged_on"]
    assert planned[2]["slo_judged_on"].startswith("the point estimate")
    assert "not in the band" not in planned[2]["slo_judged_on"]
    trace_path = out / "plan_trace.csv"
    from schedsim.traces.io import load_trace, trace_stats

    scale = 20000 / trace_stats(load_trace(trace_path))["mean_rate"]
    for name, entry in plan["plans"].items():
        n = entry["replicas"]
        assert n >= planned[2]["plans"][name]["replicas"]
        flags = [f"--max-queue-delay-us={entry['settings']['max_queue_delay_us']}"] if entry["settings"] else []
        edge = {}
        for count in (n, n - 1):
            run = schedsim("run", trace_path, "--policy", name, *flags, "--rate-scale", repr(scale / count),
                           "--band-arrivals", "resample", "--json")
            assert run.returncode == 0, run.stderr
            s = json.loads(run.stdout)
            edge[count] = max(s["p99_ms"], s["p99_ms_hi"])
        assert edge[n] <= 5 < edge[n - 1], (name, edge)
        assert entry["slo_bands"]["p99_ms<=5"][1] == pytest.approx(
            json.loads(schedsim("run", trace_path, "--policy", name, *flags, "--rate-scale", repr(scale / n),
                                "--band-arrivals", "resample", "--json").stdout)["p99_ms_hi"])


def test_plan_beats_no_batching(planned):
    proc, _, plan = planned
    dyn, naive = plan["plans"]["dynamic"], plan["plans"]["none"]
    assert dyn["replicas"] < naive["replicas"]
    assert dyn["cost_per_hour"] == dyn["replicas"] * 2.5
    assert f"dynamic needs {dyn['replicas']} GPUs where none needs {naive['replicas']}" in proc.stdout


def test_plans_answer_is_minimal(planned):
    """Run the planned setting alone on N and on N-1 replicas: N meets the SLO, N-1 does not."""
    _, out, plan = planned
    trace_path = out / "plan_trace.csv"
    from schedsim.traces.io import load_trace, trace_stats

    scale = 20000 / trace_stats(load_trace(trace_path))["mean_rate"]
    for name, entry in plan["plans"].items():
        n = entry["replicas"]
        flags = [f"--max-queue-delay-us={entry['settings']['max_queue_delay_us']}"] if entry["settings"] else []
        p99 = {}
        for count in (n, n - 1):
            run = schedsim("run", trace_path, "--policy", name, *flags, "--rate-scale", repr(scale / count), "--json")
            assert run.returncode == 0, run.stderr
            p99[count] = json.loads(run.stdout)["p99_ms"]
        assert p99[n] <= 5 < p99[n - 1], (name, p99)
        assert entry["one_fewer"]["meets_slo"] is False


def test_plan_bad_input(tmp_path):
    assert_one_line_error(schedsim("plan", "--qps", "1000"), "a plan needs an SLO")
    assert_one_line_error(schedsim("plan", "--qps", "-3", "--slo-p99-ms", "5"), "--qps")
    assert_one_line_error(schedsim("plan", "--qps", "1e6", "--slo-p99-ms", "0.1", "--requests", "200",
                                   "--max-replicas", "2", "--naive-policy", ""), "--max-replicas")


def test_llm_sweep_on_ttft_recommends_a_setting_that_meets_it(tmp_path):
    """LLM policies sweep the same way, on their own metrics (here TTFT p99)."""
    azure = ROOT / "docs" / "examples" / "azure_sample.csv"
    out = tmp_path / "sweep"
    proc = schedsim("sweep", azure, "--policy", "paged-kv", "--grid", "max_num_seqs=1,4,16",
                    "--slo", "ttft_p99_ms<=200", "--out", out)
    assert proc.returncode == 0, proc.stderr
    best = json.loads((out / "best.json").read_text())["best"]
    command = next(line for line in proc.stdout.splitlines() if line.startswith("reproduce: "))
    alone = schedsim(*command.removeprefix("reproduce: schedsim ").split(), "--json")
    assert alone.returncode == 0, alone.stderr
    summary = json.loads(alone.stdout)
    assert summary["ttft_p99_ms"] <= 200
    assert summary["ttft_p99_ms"] == best["metrics"]["ttft_p99_ms"]


# --- the SLO judged on prediction bands ------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from schedsim.planning.objective import band_level, judged, meets  # noqa: E402

_cell = st.tuples(st.floats(1.0, 100.0), st.floats(0.0, 30.0), st.floats(0.0, 30.0),
                  st.floats(100.0, 10_000.0))


@settings(max_examples=300, deadline=None)
@given(st.lists(_cell, min_size=1, max_size=12), st.floats(5.0, 120.0))
def test_the_choice_under_the_band_is_never_worse_than_under_the_point_estimate(cells_, limit):
    """Cells with a point p99, a band around it and a throughput; SLO p99_ms<=limit, most
    throughput wins. Judged on the band: every cell that meets the SLO meets it at its point
    estimate too; the chosen cell meets it on both; when the two choices differ the band's
    choice has the lower upper edge (the point's choice misses on its band), and it never
    claims more throughput than the point's choice."""
    slo = parse_slo([], limit)
    objective = Objective()
    banded = [{"cell": i, "p99_ms": p, "p99_ms_lo": p - below, "p99_ms_hi": p + above, "throughput_rps": t}
              for i, (p, below, above, t) in enumerate(cells_)]
    plain = [{k: v for k, v in r.items() if not k.endswith(("_lo", "_hi"))} for r in banded]
    assert {r["cell"] for r in banded if meets(r, slo)} <= {r["cell"] for r in plain if meets(r, slo)}
    by_band, by_point = banded[rank(banded, slo, objective)[0]], plain[rank(plain, slo, objective)[0]]
    if not meets(by_band, slo):
        return   # nothing meets on the band: no recommendation
    assert meets(plain[by_band["cell"]], slo) and by_band["p99_ms_hi"] <= limit
    assert by_band["throughput_rps"] <= by_point["throughput_rps"] * (1 + objective.tie_tolerance) + 1e-9
    if by_band["cell"] != by_point["cell"]:
        assert by_band["p99_ms_hi"] <= banded[by_point["cell"]]["p99_ms_hi"] or \
            not meets(banded[by_point["cell"]], slo)


def test_judged_value_is_the_band_edge_on_the_slo_side_never_better_than_the_point():
    upper, lower = parse_slo(["p99_ms<=10", "throughput_rps>=100"])
    row = {"p99_ms": 8.0, "p99_ms_lo": 7.0, "p99_ms_hi": 11.0, "throughput_rps": 120.0,
           "throughput_rps_lo": 95.0, "throughput_rps_hi": 130.0}
    assert judged(row, upper) == 11.0 and judged(row, lower) == 95.0
    assert judged({"p99_ms": 8.0, "p99_ms_hi": 7.5}, upper) == 8.0   # the point beyond the edge
    assert judged({"p99_ms": 8.0}, upper) == 8.0
    assert not meets(row, (upper,)) and meets({"p99_ms": 8.0}, (upper,))
    assert band_level(0.95) == pytest.approx(0.9) and band_level(0) == 0
    with pytest.raises(InputError, match="--slo-confidence"):
        band_level(0.4)


def test_sweep_judges_the_slo_on_the_band_and_says_so(trace, tmp_path):
    args = ("sweep", trace, "--grid", "max_queue_delay_us=0,3000", "--rate-scale", "4", "--slo-p99-ms", "3",
            "--workers", "1", "--no-plot")
    proc = schedsim(*args, "--out", tmp_path / "band")
    assert proc.returncode == 0, proc.stderr
    assert "SLO judged on the edge of each setting's 90% prediction band" in " ".join(proc.stdout.split())
    best = json.loads((tmp_path / "band" / "best.json").read_text())
    assert best["slo_confidence"] == 0.95 and "90% prediction band" in best["slo_judged_on"]
    # The bundled profile has no host record, and the verdict says its band lacks the host.
    assert "not in the band: the host's speed" in best["slo_judged_on"]
    margin = best["best"]["slo_margins"][0]
    assert margin["judged_value"] >= margin["value"] and margin["band"][0] <= margin["band"][1]
    header = (tmp_path / "band" / "sweep.csv").read_text().splitlines()[0].split(",")
    assert "p99_ms_lo" in header and "p99_ms_hi" in header
    point = schedsim(*args, "--slo-confidence", "0", "--out", tmp_path / "point")
    assert point.returncode == 0, point.stderr
    best0 = json.loads((tmp_path / "point" / "best.json").read_text())
    assert best0["slo_judged_on"].startswith("the point estimate") and "band" not in best0["best"]["slo_margins"][0]
    assert best0["best"]["metrics"]["p99_ms"] == best["best"]["metrics"]["p99_ms"] or \
        best0["best"]["cell"] != best["best"]["cell"]
    bad = schedsim(*args, "--slo-confidence", "1.5")
    assert_one_line_error(bad, "--slo-confidence")
