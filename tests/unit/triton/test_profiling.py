"""``schedsim profile --backend triton`` end to end on a real CPU Triton server (bert-tiny,
KIND_CPU), with few samples: the table loads, covers the sizes, carries the named terms,
and the simulator runs on it. Skipped where no tritonserver can be found."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error, schedsim
from schedsim.cost.model import CostModel
from schedsim.cost.profile import load_profile
from schedsim.errors import InputError
from schedsim.triton.profiling import TritonProfileSpec, run_triton_profile


def _server_or_skip():
    from schedsim.triton.server import find_tritonserver

    try:
        return find_tritonserver()
    except InputError as exc:
        pytest.skip(f"no tritonserver: {exc}")


@pytest.mark.slow
def test_bert_tiny_through_a_cpu_server_gives_a_table_the_simulator_runs_on(tmp_path):
    _server_or_skip()
    out = tmp_path / "tiny-triton.csv"
    # gRPC: its request path (client latency beyond Triton's request time) is positive; over
    # HTTP, Triton's request time can end after the client has its answer (a warning then).
    proc = schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny", "--batch-sizes", "1,2,4",
                    "--seq-lens", "16", "--triton-batches", "20", "--triton-warmup-batches", "4",
                    "--triton-zero-delay-requests", "20", "--triton-protocol", "grpc",
                    "--triton-wake-requests", "5", "--pair-batches", "1,4", "--min-time-s", "0", "--warmup-ms", "0",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out} (3 batch sizes through Triton)" in proc.stdout
    prof = load_profile(out)
    assert prof.batches.tolist() == [1, 2, 4] and prof.seq_lens.tolist() == [16]
    # Every measured execution was a full batch of its size: 20 each, from Triton's own counts.
    assert prof.columns["n"].tolist() == [20, 20, 20]
    meta = prof.meta
    assert meta["backend"] == "triton" and meta["backend_version"] and meta["device"] == "cpu (KIND_CPU)"
    assert meta["dispatch_overhead_us"] >= 0 and meta["dispatch_overhead_us_per_sample"] >= 0
    assert meta["dispatch_overhead"]["batch"] == [1, 2, 4]
    terms = meta["triton_terms"]
    assert terms["requests"] == 20 and terms["queue_us_at_zero_delay"] >= 0 and terms["request_path_us"] > 0
    # Per-batch samples from the trace: one request in b traced, so about one per execution.
    assert prof.samples is not None
    for b in (1, 2, 4):
        s = prof.samples[(b, 16)]
        assert 2 <= s.size <= 20 and (s > 0).all()
    mean = prof.column("latency_ms_mean")[0]
    assert np.all(mean > 0)
    raw = out.parent / "tiny-triton.triton"
    assert (raw / "tritonserver.log").is_file() and (raw / "trace.json").is_file()
    assert json.loads((raw / "stats_profile_b2.json").read_text())["after"]["name"] == "profile_b2"

    # What idling costs: one point per pause, idle times rising, extras drawn from quantiles.
    wake = meta["wake_curve"]
    assert 3 <= len(wake["idle_us"]) <= 9 and sum(wake["n"]) >= 27
    assert all(b > a for a, b in zip(wake["idle_us"], wake["idle_us"][1:]))
    # Two instances: each size beside each other, both directions from one stretch.
    pairs = meta["pair_slowdown"]
    assert pairs["batch"] == [1, 4] and len(pairs["runs"]) == 3
    assert all(0.3 < v < 20 for row in pairs["slowdown"] for v in row)

    cost = CostModel.from_profile(prof)
    assert cost.wake_curve is not None and cost.wake_curve.random and cost.pair_slowdown is not None
    assert cost.spread == "empirical"
    assert cost.mean_s(2, 16) == pytest.approx(mean[1] / 1e3 + cost.dispatch_s(2))

    trace = tmp_path / "arrivals.csv"
    assert schedsim("trace", "gen", "--out", trace, "--seed", "1", "--rate", "100", "--n", "300").returncode == 0
    run = tmp_path / "run"
    proc = schedsim("run", trace, "--profile", out, "--max-batch-size", "4", "--max-queue-delay-us", "500",
                    "--out", run)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 300 and summary["p99_ms"] > 0
    proc = schedsim("run", trace, "--profile", out, "--max-batch-size", "4", "--instances", "2", "--out", run,
                    "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "summary.json").read_text())["completed"] == 300


def test_bad_flags_are_one_line_before_any_server_starts(tmp_path):
    out = tmp_path / "p.csv"
    assert_one_line_error(schedsim("profile", "--backend", "triton", "--model", "builtin:llama-1b", "--out", out),
                          "builtin:bert-tiny or builtin:bert-base")
    assert_one_line_error(schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny",
                                   "--seq-lens", "16,32", "--out", out), "one seq_len")
    with pytest.raises(InputError, match="--triton-depth: 0"):
        TritonProfileSpec(depth=0).check()
    with pytest.raises(InputError, match="--min-time-s: -1"):
        TritonProfileSpec(min_time_s=-1).check()
    assert_one_line_error(schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny",
                                   "--triton-protocol", "quic", "--out", out), "expected http or grpc")
    assert_one_line_error(schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny",
                                   "--triton-arrivals", "burst", "--out", out), "expected closed or open")
    with pytest.raises(InputError, match="--host-variation-s -1"):
        TritonProfileSpec(host_variation_s=-1).check()
    with pytest.raises(InputError, match="--triton-open-load: 1.5"):
        TritonProfileSpec(arrivals="open", open_load=1.5).check()
    with pytest.raises(InputError, match="--triton-host-servers 2: .* with --host-variation-s"):
        TritonProfileSpec(host_servers=2).check()
    assert_one_line_error(schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny",
                                   "--triton-host-servers", "-1", "--host-variation-s", "1", "--out", out),
                          "--triton-host-servers -1")
    assert not out.exists()


@pytest.mark.slow
def test_open_arrivals_and_host_variation_through_the_server(tmp_path):
    _server_or_skip()
    out = tmp_path / "open.csv"
    proc = schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny", "--batch-sizes", "1,4",
                    "--seq-lens", "16", "--triton-batches", "20", "--triton-warmup-batches", "4",
                    "--triton-zero-delay-requests", "0", "--min-time-s", "0", "--warmup-ms", "0",
                    "--triton-arrivals", "open", "--triton-open-load", "0.8", "--host-variation-s", "0.4",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    prof = load_profile(out)
    meta, table = prof.meta, prof.table.astype({"closed_loop_ms_mean": float, "open_rate_rps": float,
                                                "cycle_ms": float})
    assert meta["arrivals"] == "open" and meta["open_load"] == 0.8 and "open-loop Poisson stream" in meta["timing"]
    # The open stretch sent as many requests as the closed one: 20 batches of b, each full
    # (a 1 s queue delay), counted by Triton beside the closed loop's own statistics.
    assert table["n"].tolist() == [20, 20]
    assert (table["closed_loop_ms_mean"] > 0).all() and (table["latency_ms_mean"] > 0).all()
    # The stream ran at 0.8 of each size's closed-loop throughput (b per cycle).
    assert table["open_rate_rps"].to_numpy() == pytest.approx(0.8 * table["batch"] / (table["cycle_ms"] / 1e3))
    raw = out.parent / "open.triton"
    for b in (1, 4):
        opened = json.loads((raw / f"stats_profile_b{b}_open.json").read_text())
        closed = json.loads((raw / f"stats_profile_b{b}.json").read_text())
        assert opened["before"]["inference_count"] >= closed["after"]["inference_count"]
    # The host-variation record the band reads: 5 rounds of lone requests through the server.
    host = meta["host_variation"]
    assert host["rounds"] == 5 and "through the server" in host["call"] and host["between_runs_cv"] >= 0
    assert len(host["round_factors"]) == 5 and np.mean(host["round_factors"]) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_host_variation_over_fresh_servers_and_the_execution_log(tmp_path):
    """--triton-host-servers: the record's rounds are servers (the table's own first, then each
    fresh one), over the table's server; the one-server record is kept beside it. Every
    profiled execution is in the execution log, full batches of its model's size."""
    from schedsim.triton.execution_log import read_execution_log

    _server_or_skip()
    out = tmp_path / "hosts.csv"
    proc = schedsim("profile", "--backend", "triton", "--model", "builtin:bert-tiny", "--batch-sizes", "1,2",
                    "--seq-lens", "8", "--triton-batches", "10", "--triton-warmup-batches", "2",
                    "--triton-zero-delay-requests", "0", "--triton-wake-requests", "0", "--min-time-s", "0",
                    "--warmup-ms", "0", "--no-triton-trace", "--host-variation-s", "0.3", "--triton-host-servers", "2",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "server 2 of 2" in proc.stderr
    host = load_profile(out).meta["host_variation"]
    assert host["rounds"] == 3 and host["scope"].startswith("3 Triton servers") and "fresh one" in host["method"]
    assert host["rounds_are"] == "servers"  # a band's path stays on one server
    assert host["round_factors"][0] == pytest.approx(1.0, abs=1e-4) and len(host["window_factors"]) == 3
    assert host["one_server"]["rounds"] == 5 and "_first_server_round" not in host["one_server"]
    raw = out.parent / "hosts.triton"
    assert (raw / "host_server_1.log").is_file() and (raw / "host_server_2.log").is_file()
    for b in (1, 2):  # every warm-up and measured batch (12 or more), each of b requests
        (log,) = (raw / "executions").glob(f"profile_b{b}_*.log")
        batches = [line.split(" ")[3].count(",") + 1 for line in log.read_text().splitlines()]
        assert len(batches) >= 12 and set(batches) == {b}
    assert read_execution_log(raw / "executions")  # the reader the live runs use parses it


@pytest.mark.slow
@pytest.mark.parametrize("protocol, client", [("http", "HTTP, the live client's aiohttp"), ("grpc", "gRPC")])
def test_the_closed_loop_reaches_the_server_over_either_protocol(tmp_path, protocol, client):
    """http sends the live client's requests (schedsim.triton.client's bodies); grpc, tritonclient
    calls. Either way every measured execution is a full batch, counted by Triton itself."""
    _server_or_skip()
    spec = TritonProfileSpec(model="builtin:bert-tiny", batch_sizes=(1, 2), seq_len=8, batches=10, warmup_batches=2,
                             trace=False, zero_delay_requests=10, protocol=protocol, warmup_s=0, min_time_s=0)
    outcome = run_triton_profile(spec, tmp_path / "p.csv", note=lambda _: None)
    prof = load_profile(outcome.path)
    assert prof.columns["n"].tolist() == [10, 10]
    assert prof.meta["protocol"] == protocol and client in prof.meta["timing"]
    terms = prof.meta["triton_terms"]
    assert terms["protocol"].startswith(client) and terms["requests"] == 10
    assert terms["compute_output_us_per_request"] > 0 and terms["request_path_us"] > 0
    assert np.all(prof.columns["cycle_ms"].astype(float) > 0)


def test_quick_sizes_are_timed_for_at_least_the_minimum_stretch():
    from schedsim.triton.profiling import _stretch_batches

    spec = TritonProfileSpec(batches=100, warmup_batches=20, warmup_s=0.5, min_time_s=1.0)
    # A 1 ms batch: 20 warm-up batches are 20 ms, 480 more make 0.5 s; 1,000 measured make 1 s.
    assert _stretch_batches(spec, 1e-3) == (480, 1000)
    # A 20 ms batch: the counts already cover the times.
    assert _stretch_batches(spec, 20e-3) == (5, 100)
    assert _stretch_batches(TritonProfileSpec(batches=7, warmup_s=0, min_time_s=0), 1e-3) == (0, 7)
