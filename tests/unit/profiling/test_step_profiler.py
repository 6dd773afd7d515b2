"""``schedsim profile llm``: the step profiler run as users run it, in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from schedsim.cost.step_profile import SCHEMA, load_step_profile  # noqa: E402
from schedsim.profiling.step_grid import Composition, step_grid  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COLUMNS = ("prefill_seqs,prefill_chunk,prefill_context,decode_seqs,decode_context,decode_kv_tokens,"
           "latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n,fresh_samples")


def _run(*args, timeout=120):
    # One thread: on a shared CPU, torch's spinning worker threads make tiny steps 100x slower.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "schedsim.cli.profile", "llm", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_quick_cpu_profile_writes_the_step_profile_format(tmp_path):
    out = tmp_path / "tiny.csv"
    proc = _run("--model", "builtin:llama-tiny", "--dtype", "fp32", "--device", "cpu", "--quick",
                "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and "step compositions" in proc.stdout
    lines = out.read_text().splitlines()
    assert lines[0] == COLUMNS
    assert len(lines) - 1 == len(step_grid(196608, quick=True))
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["schema"] == SCHEMA and meta["partial"] is False
    for key in ("device", "backend", "torch", "model", "dtype", "cuda_graphs", "date", "command",
                "block_size", "cuda_graph_batch_sizes", "max_context_measured", "swap_gb_per_s",
                "step_overhead_us"):
        assert key in meta, key
    assert meta["backend"] == "torch" and meta["cuda_graphs"] is False
    assert meta["swap_gb_per_s"] > 0 and meta["step_overhead_us"] > 0
    assert ("fit" in meta) != ("fit_skipped" in meta)
    assert meta["cpu_pinning"] is None        # not asked for
    assert meta["first_call"]["steps"] == 40 and meta["first_call"]["priced"] is False
    prof = load_step_profile(out)        # the simulator's own reader takes it
    assert len(prof) == len(lines) - 1


def test_bad_flags_are_one_line_errors(tmp_path):
    proc = _run("--model", "builtin:llama-9b", "--device", "cpu", "--quick", "--out", tmp_path / "x.csv")
    assert proc.returncode == 2 and "llama-9b" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run("--model", "builtin:llama-tiny", "--device", "cpu", "--out", tmp_path / "x.txt")
    assert proc.returncode == 2 and ".csv" in proc.stderr
    proc = _run("--model", "builtin:llama-tiny", "--device", "cpu", "--cpu", "banana", "--out", tmp_path / "x.csv")
    assert proc.returncode == 2 and "--cpu" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.csv").exists()


def test_grid_covers_what_the_simulator_asks():
    grid = step_grid(196608)
    dec = [c for c in grid if c.kind == "decode"]
    pre = [c for c in grid if c.kind == "prefill"]
    mixed = [c for c in grid if c.kind == "mixed"]
    assert {c.decode_seqs for c in dec} >= {1, 32, 256}
    assert max(c.decode_context for c in dec) == 196607     # attends over 196608 tokens
    assert max(c.prefill_chunk for c in pre) == 8192 and max(c.longest for c in pre) == 196608
    assert mixed and all(c.kv_tokens <= 1 << 21 for c in grid)
    assert Composition(0, 0, 0, 256, 8000).blocks(16) == 256 * 501
    # Decodes with mixed contexts, at graph batch sizes and beside a prefill chunk.
    spread = [c for c in grid if c.decode_contexts]
    assert {c.decode_seqs for c in spread if c.kind == "decode"} >= {4, 32, 256}
    assert any(c.kind == "mixed" for c in spread)
    assert all(c.decode_kv_tokens < c.decode_seqs * (c.decode_context + 1) for c in spread)
    # Capped contexts drop what does not fit.
    assert max(c.longest for c in step_grid(4096)) <= 4096


def test_host_variation_record_times_the_cheapest_step(tmp_path):
    """``host_variation_s`` adds the sidecar's ``host_variation`` record (5 rounds of the
    cheapest composition), as ``schedsim profile --host-variation-s`` does for request-level
    profiles; without it the sidecar has none."""
    from schedsim.profiling.step_profiler import StepProfileSpec, run_step_profile

    comps = ((0, 0, 0, 1, 16), (1, 32, 0, 0, 0))
    base = dict(model="builtin:llama-tiny", dtype="fp32", device="cpu", compositions=comps, quick=True,
                min_samples=3, max_time_s=2.0, warmup_calls=1, swap_blocks=8, fresh_shapes=False)
    out = tmp_path / "hv.csv"
    run_step_profile(StepProfileSpec(**base, host_variation_s=0.12), out)
    rec = json.loads(out.with_suffix(".json").read_text())["host_variation"]
    assert rec["rounds"] == 5 and rec["calls"] > 5 and rec["window_s"] == pytest.approx(0.03)
    assert rec["between_runs_cv"] >= 0 and rec["within_run_cv"] >= 0
    prof = load_step_profile(out)
    cheapest = int(np.argmin(prof.columns["latency_ms_p50"]))
    label = Composition(*(int(prof.columns[k][cheapest]) for k in
                          ("prefill_seqs", "prefill_chunk", "prefill_context", "decode_seqs", "decode_context"))).label
    assert rec["call"] == f"one step of {label}, wall time around execute()"
    plain = tmp_path / "plain.csv"
    run_step_profile(StepProfileSpec(**base), plain)
    assert "host_variation" not in json.loads(plain.with_suffix(".json").read_text())
    with pytest.raises(Exception, match="host-variation-s"):
        StepProfileSpec(**base, host_variation_s=-1).check()


def test_the_llm_band_draws_host_speed_from_a_step_profiles_record(tmp_path):
    """An LLM run's band adds a host-speed factor per replication when its step profile's
    sidecar carries ``host_variation`` (what ``schedsim profile llm --host-variation-s``
    writes), and none without."""
    import shutil

    from cli_helpers import schedsim

    steps = ROOT / "tests" / "data" / "llm_steps_synthetic.csv"
    hv = tmp_path / "hv.csv"
    shutil.copy(steps, hv)
    meta = json.loads(steps.with_suffix(".json").read_text())
    meta["host_variation"] = {"between_runs_cv": 0.05, "within_run_cv": 0.1, "window_s": 0.25,
                              "rounds": 5, "round_medians_ms": [1.0, 1.05, 0.95, 1.0, 1.02]}
    hv.with_suffix(".json").write_text(json.dumps(meta))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{i * 0.05:.3f},{100 + 37 * (i % 11)},{5 + 3 * (i % 7)}\n" for i in range(60)))
    bands = {}
    for name, profile in (("plain", steps), ("hv", hv)):
        out = tmp_path / name
        proc = schedsim("run", trace, "--policy", "paged-kv", "--profile", profile, "--num-gpu-blocks", "200",
                        "--out", out, "--quiet")
        assert proc.returncode == 0, proc.stderr
        bands[name] = json.loads((out / "summary.json").read_text())
    assert bands["plain"]["band"]["host_sigma"] == 0
    assert bands["hv"]["band"]["host_sigma"] > 0.05
    assert any("host speed" in s for s in bands["hv"]["band"]["sources"])
    plain, hosty = bands["plain"], bands["hv"]
    assert hosty["tpot_p50_ms_hi"] - hosty["tpot_p50_ms_lo"] > plain["tpot_p50_ms_hi"] - plain["tpot_p50_ms_lo"]
    assert hosty["tpot_p50_ms"] == plain["tpot_p50_ms"]   # the point estimate does not move
