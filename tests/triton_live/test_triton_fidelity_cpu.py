"""A small fidelity table against a real Triton server on the CPU.

The cost table is measured through the server (``schedsim profile --backend triton``,
bert-tiny in Triton's Python backend, KIND_CPU) and predicts the server's own mean time
per request (Triton's statistics: ``success`` time, from the request's arrival at Triton
to its response, over the requests after the warm-up) for cells that ``schedsim live
--backend triton`` drives open loop. The same table with every batch 30% dearer must miss
by more: the comparison can tell a right table from a wrong one.

Each cell runs in three rounds, each round on a table measured just before it and a fresh
server per run, and is judged on the median, as the H200 table is: on a shared 2-core
machine the host's speed drifts from minute to minute and one live run in a few meets a
stall. The tolerance is wide, as the CPU table's is (docs/validation/cpu.md): on an
otherwise idle 2-core machine the loaded cell came out 20-51% low in the median of its
rounds, the client, the server and its Python stub sharing the two cores with the model
(docs/validation/triton.md, the CPU server). What tells a right table from a wrong one is
the second test: the table 30% too dear moves every cell's error up by more than 15 points,
judged on the rounds whose server ran its batches at no more than 1.3x its table (Triton's
own batch statistics in the cell): a round whose server ran 2.9x its table (seen on a shared
CI host) puts the live mean so far above both tables that 30% more moves the error by only
10 points, which judges the host, not the comparison.
"""

import json
import os
import time

import numpy as np
import pytest

from cli_helpers import schedsim
from schedsim.cost.profile import load_profile, save_profile
from triton_helpers import poisson_trace, pytestmark  # noqa: F401 - skip/require a tritonserver

ROUNDS = 3
LOADS = (0.2, 0.4)
"""Fractions of the table's own capacity (full batches of 8 back to back)."""
TOLERANCE_PCT = 60.0
POLICY = ["--policy", "dynamic", "--max-batch-size", "8", "--max-queue-delay-us", "500", "--warmup-s", "0.5"]


def scaled_profile(path, factor, out):
    """The same table with every batch's time (means, percentiles, raw samples) times ``factor``."""
    prof = load_profile(path)
    table = prof.table.copy()
    for col in [c for c in table.columns if c.startswith("latency_ms_")]:
        table[col] = table[col] * factor
    samples = {k: v * factor for k, v in prof.samples.items()} if prof.samples else None
    save_profile(table, dict(prof.meta), out, samples)
    return out


def server_mean_ms(live_dir) -> float:
    success = json.loads((live_dir / "triton_stats.json").read_text())["delta"]["inference_stats"]["success"]
    return success["ns"] / success["count"] / 1e6


def server_speed(live_dir, profile) -> float:
    """How slowly the live server ran its batches against the table: per batch size, Triton's
    compute_input + compute_infer + compute_output per execution over the table's
    latency_ms_mean, geometric mean weighted by executions."""
    table = load_profile(profile).table
    mean = dict(zip(table["batch"].astype(int), table["latency_ms_mean"].astype(float)))
    batches = json.loads((live_dir / "triton_stats.json").read_text())["delta"]["batch_stats"]
    logs, weights = [], []
    for b, phases in batches.items():
        n = phases["compute_infer"]["count"]
        if n and int(b) in mean:
            ns = sum(phases[p]["ns"] for p in ("compute_input", "compute_infer", "compute_output") if p in phases)
            logs.append(np.log(ns / n / 1e6 / mean[int(b)]))
            weights.append(n)
    return float(np.exp(np.average(logs, weights=weights)))


def predicted_mean_ms(trace, table) -> float:
    sim = schedsim("run", trace, *POLICY, "--profile", table, "--band", "0", "--json")
    assert sim.returncode == 0, sim.stderr
    return json.loads(sim.stdout)["mean_ms"]


def measure_profile(out):
    proc = schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny", "--device", "cpu",
                    "--batch-sizes", "1,2,4,8", "--seq-lens", "16", "--triton-batches", "60",
                    "--triton-warmup-batches", "5", "--min-time-s", "0.5", "--triton-zero-delay-requests", "40",
                    "--triton-wake-requests", "5", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def triton_table(tmp_path_factory):
    """Every (load, round) cell live, each predicted from a table measured just before its
    round; {load: [(live_ms, err_pct, err_x1.3_pct, server_speed)]}."""
    limit, deadline = 0.75 * (os.cpu_count() or 1), time.monotonic() + 90
    while (busy := os.getloadavg()[0]) > limit and time.monotonic() < deadline:
        time.sleep(5)  # the tests before this one may have left the one-minute load average high
    if busy > limit:
        pytest.skip(f"host busy (load {busy:.1f} on {os.cpu_count()} cores): server, client and model share the "
                    f"CPU, so its speed would be judged, not the prediction")
    tmp = tmp_path_factory.mktemp("triton-fidelity")
    cells = {load: [] for load in LOADS}
    for r in range(ROUNDS):
        profile = measure_profile(tmp / f"tiny-triton-{r}.csv")
        dear = scaled_profile(profile, 1.3, tmp / f"tiny-triton-{r}-x1.3.csv")
        if r == 0:  # the same traces in every round, from the first table's capacity
            batch8_ms = float(load_profile(profile).table.query("batch == 8")["latency_ms_mean"].iloc[0])
            capacity = 8 / (batch8_ms / 1e3)
            traces = {load: poisson_trace(tmp / f"poisson-{load}.csv", rate=load * capacity, seconds=3.0)
                      for load in LOADS}
        for load, trace in traces.items():
            live_dir = tmp / f"live-{load}-{r}"
            live = schedsim("live", trace, "--backend", "triton", "--model", "builtin:bert-tiny", *POLICY,
                            "--out", live_dir, "--json")
            assert live.returncode == 0, live.stderr
            measured = server_mean_ms(live_dir)
            errors = [100 * (predicted_mean_ms(trace, t) - measured) / measured for t in (profile, dear)]
            cells[load].append((measured, *errors, server_speed(live_dir, profile)))
    return cells


def report(cells) -> str:
    return "; ".join(f"load {load}: live {', '.join(f'{r[0]:.2f}' for r in runs)} ms, errors "
                     f"{', '.join(f'{r[1]:+.0f}%' for r in runs)} (x1.3: {', '.join(f'{r[2]:+.0f}%' for r in runs)}), "
                     f"server batches {', '.join(f'{r[3]:.2f}' for r in runs)}x the table"
                     for load, runs in cells.items())


def test_the_table_measured_through_triton_predicts_its_server_side_mean(triton_table):
    print(report(triton_table))  # the figures, with pytest -s
    for load, runs in triton_table.items():
        assert np.isfinite([r[0] for r in runs]).all()
        assert abs(np.median([r[1] for r in runs])) <= TOLERANCE_PCT, report(triton_table)


SERVER_AT_SPEED = 1.3
"""A round is judged when its server ran its batches at no more than this many times its table."""


def test_a_table_30pct_too_dear_misses_by_more(triton_table):
    judged = {load: [r for r in runs if r[3] <= SERVER_AT_SPEED] for load, runs in triton_table.items()}
    if not any(judged.values()):
        pytest.skip(f"every server ran its batches over {SERVER_AT_SPEED}x its table: {report(triton_table)}")
    for load, runs in judged.items():
        if runs:
            honest = np.median([r[1] for r in runs])
            dear = np.median([r[2] for r in runs])
            assert dear > honest + 15, report(triton_table)
