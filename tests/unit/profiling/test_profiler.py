"""The calibration harness: ONNX Runtime end to end through the CLI, bad input, partial runs.

Needs onnx and onnxruntime (skipped otherwise), not torch: the test model is built with
onnx.helper.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from schedsim.live.engines.onnx_export import make_encoder_onnx  # noqa: E402
from schedsim.errors import InputError  # noqa: E402
from schedsim.profiling.measure import sample_cell, sample_concurrent  # noqa: E402
from schedsim.cost.profile import load_profile  # noqa: E402
from schedsim.profiling.profiler import (Interrupted, Progress, ProfileSpec, _Backend, parse_sizes,  # noqa: E402
                               run_profile)

ROOT = Path(__file__).resolve().parents[3]
FAST = ["--warmup-ms", "1", "--min-iters", "5", "--min-time-s", "0", "--dispatch-iters", "20"]


def schedsim(*args):
    return subprocess.run([sys.executable, "-m", "schedsim.cli.main", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("schedsim: error: ") and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    return make_encoder_onnx(tmp_path_factory.mktemp("m") / "tiny.onnx", layers=1, hidden=32,
                             heads=2, ffn=64, vocab=500, max_positions=64)


@pytest.fixture(scope="module")
def batch_le_2_onnx(tmp_path_factory) -> Path:
    """Runs at batch 1 and 2 only: adds a [2, 1] constant, which broadcasts to no other batch."""
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.ones((2, 1), np.float32), "c")
    g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [c])
    path = tmp_path_factory.mktemp("m") / "le2.onnx"
    import onnx

    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


# -- sizes and statistics -----------------------------------------------------------------

def test_parse_sizes():
    assert parse_sizes("1,2,4-6, 8", "--b") == (1, 2, 4, 5, 6, 8)
    assert parse_sizes("4,1,4", "--b") == (1, 4)
    for bad in ("0", "a", "6-4", "", "1-x"):
        with pytest.raises(InputError, match="--b"):
            parse_sizes(bad, "--b")


def test_sample_cell_meets_both_targets():
    calls = []
    res = sample_cell(lambda: calls.append(1), warmup_s=0.0, min_iters=7, min_time_s=0.0,
                      after=lambda: 1.5)
    assert res.latency_ms.size == 7 and res.after == [1.5] * 7 and not res.truncated
    assert res.warmup_calls >= 1 and len(calls) == 7 + res.warmup_calls
    res = sample_cell(lambda: time.sleep(0.002), warmup_s=0.0, min_iters=1, min_time_s=0.02)
    assert res.latency_ms.sum() >= 20.0 and res.latency_ms.min() >= 2.0


def test_sample_cell_max_time_truncates_after_the_floor():
    res = sample_cell(lambda: time.sleep(0.003), warmup_s=0.0, min_iters=1000, min_time_s=0.0,
                      max_time_s=0.001, min_samples=4)
    assert res.truncated and res.latency_ms.size == 4


def test_sample_concurrent_runs_all_instances_together():
    active, peak = [0], [0]

    def work():
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.002)
        active[0] -= 1

    res = sample_concurrent([work, work, work], warmup_s=0.0, min_iters=5, min_time_s=0.0)
    counts = np.bincount(res.instance, minlength=3)
    assert (counts >= 5).all() and res.latency_ms.size == counts.sum()
    assert peak[0] >= 2  # calls overlapped


def test_sample_concurrent_reraises_a_thread_error():
    def boom():
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        sample_concurrent([lambda: None, boom], warmup_s=0.0, min_iters=5, min_time_s=0.0)


# -- end to end through the CLI -----------------------------------------------------------

def test_onnxruntime_end_to_end(tiny_onnx, tmp_path):
    out = tmp_path / "tiny.csv"
    proc = schedsim("profile", "--model", tiny_onnx, "--backend", "onnxruntime",
                    "--batch-sizes", "1-3", "--seq-lens", "8,16", *FAST, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out} (6 cells)" in proc.stdout
    prof = load_profile(out)
    assert prof.batches.tolist() == [1, 2, 3] and prof.seq_lens.tolist() == [8, 16]
    assert (prof.table["n"] >= 5).all()
    assert all(prof.samples[(b, s)].size == n for b, s, n in
               prof.table[["batch", "seq_len", "n"]].itertuples(index=False))
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["partial"] is False and meta["instances"] == 1
    assert meta["backend"] == "onnxruntime" and meta["model_sha256"]
    assert meta["dispatch_overhead_us"] > 0 and "machine" in meta and "drift_check" in meta
    assert meta["machine"]["cpu_pinning"] is None  # no --cpu
    assert "gpu_ms_mean" not in prof.table.columns  # no device clock on the CPU

    png = tmp_path / "show.png"
    proc = schedsim("profile", "show", out, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime" in proc.stdout and "samples/s" in proc.stdout and png.stat().st_size > 0
    proc = schedsim("profile", "compare", out, out, "--plot", tmp_path / "cmp.png")
    assert proc.returncode == 0, proc.stderr
    assert "geometric mean 1.000" in proc.stdout


def test_instances_are_recorded(tiny_onnx, tmp_path):
    out = tmp_path / "two.csv"
    proc = schedsim("profile", "--model", tiny_onnx, "--backend", "onnxruntime",
                    "--batch-sizes", "1,2", "--seq-lens", "8", "--instances", "2", *FAST,
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["instances"] == 2
    assert all(min(c) >= 5 for c in meta["instance_samples"].values())


# -- bad input: exit 2, one line ----------------------------------------------------------

def test_not_onnx(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_text("this is not a protobuf\n" * 10)
    proc = schedsim("profile", "--model", bad, "--backend", "onnxruntime", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "model.onnx", "not an ONNX model")


def test_onnx_without_batch_axis(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(g), path)
    proc = schedsim("profile", "--model", path, "--backend", "onnxruntime", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "fixed.onnx", "no dynamic batch axis")


def test_backend_not_installed_names_the_package(tiny_onnx, tmp_path):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("tensorrt is installed here")
    except ImportError:
        pass
    proc = schedsim("profile", "--model", tiny_onnx, "--backend", "tensorrt", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "'tensorrt'")


@pytest.mark.parametrize("args, needle", [
    (["--batch-sizes", "0,1"], "--batch-sizes"),
    (["--precision", "fp8"], "--precision fp8"),
    (["--backend", "tvm"], "--backend tvm"),
    (["--out", "x.parquet"], "must name a .csv"),
    (["--provider", "nope"], "--provider nope"),
])
def test_bad_flags(tiny_onnx, tmp_path, args, needle):
    base = {"--backend": "onnxruntime", "--out": str(tmp_path / "x.csv")}
    flags = dict(zip(args[::2], args[1::2]))
    merged = base | flags
    proc = schedsim("profile", "--model", tiny_onnx, *[v for kv in merged.items() for v in kv], *FAST)
    assert_one_line_error(proc, needle)


def test_torch_backend_refuses_onnx_files(tiny_onnx, tmp_path):
    pytest.importorskip("torch")
    proc = schedsim("profile", "--model", tiny_onnx, "--backend", "torch", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "builtin")


def test_error_mid_run_keeps_measured_cells(batch_le_2_onnx, tmp_path):
    out = tmp_path / "le2.csv"
    proc = schedsim("profile", "--model", batch_le_2_onnx, "--backend", "onnxruntime",
                    "--batch-sizes", "1-4", "--seq-lens", "4,8", *FAST, "--out", out)
    assert_one_line_error(proc, "batch=3", "kept 4 measured cells", "partial")
    prof = load_profile(out)
    assert prof.batches.tolist() == [1, 2] and prof.seq_lens.tolist() == [4, 8]
    meta = prof.meta
    assert meta["partial"] is True and "3x4" in meta["missing_cells"]
    assert meta["warnings"][0].startswith("PARTIAL PROFILE")
    proc = schedsim("profile", "show", out)
    assert proc.returncode == 0 and "PARTIAL PROFILE" in proc.stdout


# -- Ctrl-C and out-of-memory, in process --------------------------------------------------

def _spec(model, **kw):
    base = dict(model=str(model), backend="onnxruntime", batch_sizes=(1, 2, 3),
                seq_lens=(4, 8), warmup_ms=0.0, min_iters=3, min_time_s=0.0, dispatch_iters=0)
    return ProfileSpec(**(base | kw))


def test_ctrl_c_keeps_finished_cells(tiny_onnx, tmp_path):
    class StopAfterThree(Progress):
        def cell_done(self, index, batch, seq_len, stats):
            if index == 2:
                raise KeyboardInterrupt

    out = tmp_path / "c.csv"
    with pytest.raises(Interrupted) as info:
        run_profile(_spec(tiny_onnx), out, StopAfterThree())
    assert info.value.outcome.cells == 2 and not info.value.outcome.complete
    prof = load_profile(out)
    # Cells (1,4), (1,8), (2,4) were measured; the table keeps the complete batch row.
    assert prof.batches.tolist() == [1] and prof.meta["partial"] is True
    assert "2x4" in prof.meta["dropped_cells"]
    assert "interrupted" in prof.meta["warnings"][0]


def test_out_of_memory_is_an_input_error_and_keeps_cells(tiny_onnx, tmp_path, monkeypatch):
    real_open = _Backend.open

    def open_with_oom(self, stack):
        runners = real_open(self, stack)
        real = runners[0].prepare

        def prepare(b, s):
            if b == 3:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real(b, s)

        runners[0].prepare = prepare
        return runners

    monkeypatch.setattr(_Backend, "open", open_with_oom)
    out = tmp_path / "oom.csv"
    with pytest.raises(InputError, match=r"out of memory at batch=3 seq_len=4: kept 4"):
        run_profile(_spec(tiny_onnx), out)
    assert load_profile(out).batches.tolist() == [1, 2]


def test_no_complete_row_writes_nothing(batch_le_2_onnx, tmp_path):
    out = tmp_path / "none.csv"
    with pytest.raises(InputError, match="nothing written"):
        run_profile(_spec(batch_le_2_onnx, batch_sizes=(3, 4)), out)
    assert not out.exists()


# -- the power-cap phases ------------------------------------------------------------------

def test_power_cap_phases_write_a_steady_table_measurement(tiny_onnx, tmp_path):
    out = tmp_path / "pc.csv"
    outcome = run_profile(_spec(tiny_onnx, batch_sizes=(1, 2, 4, 8), seq_lens=(8,), power_cap_s=0.05), out)
    assert outcome.complete
    meta = json.loads(out.with_suffix(".json").read_text())
    # On a CPU the clock does not move by design; either way the measurement is kept, and
    # written as power_cap only when the factors spread by more than 1%.
    cap = meta.get("power_cap") or meta["power_cap_measured"]
    assert cap["table"] == "steady" and cap["probe_batch"] == 4 and cap["batch"] == [1, 2, 4, 8]
    assert cap["factor"][cap["batch"].index(4)] == 1.0        # the probe's own phase is the reference
    assert cap["tau_rise_ms"] > 0 and cap["tau_fall_ms"] > 0
    assert ("power_cap" in meta) == (max(cap["factor"]) - min(cap["factor"]) > 0.01)


def test_power_cap_needs_one_instance_and_a_nonnegative_phase(tiny_onnx, tmp_path):
    with pytest.raises(InputError, match="--power-cap-s -1"):
        run_profile(_spec(tiny_onnx, power_cap_s=-1.0), tmp_path / "x.csv")
    with pytest.raises(InputError, match="one instance"):
        run_profile(_spec(tiny_onnx, power_cap_s=1.0, instances=2), tmp_path / "x.csv")


# -- the pair-slowdown grid (two instances) -------------------------------------------------

def test_pair_slowdown_grid_is_measured_for_every_pair_of_sizes(tiny_onnx, tmp_path):
    out = tmp_path / "duo.csv"
    spec = _spec(tiny_onnx, batch_sizes=(1, 2, 3, 4), seq_lens=(8,), instances=2, pair_s=0.02)
    assert run_profile(spec, out).complete
    grid = json.loads(out.with_suffix(".json").read_text())["pair_slowdown"]
    assert grid["batch"] == [1, 2, 4] and grid["seq_len"] == 8       # powers of two and the largest
    assert np.asarray(grid["slowdown"]).shape == (3, 3) and len(grid["alone_ms"]) == 3
    assert np.isfinite(grid["slowdown"]).all() and (np.asarray(grid["slowdown"]) > 0).all()
    # The sidecar's grid is what the simulator reads.
    assert load_profile(out).meta["pair_slowdown"]["batch"] == [1, 2, 4]


def test_pair_slowdown_needs_two_instances_and_measured_sizes(tiny_onnx, tmp_path):
    with pytest.raises(InputError, match="--instances 2"):
        run_profile(_spec(tiny_onnx, pair_s=0.1), tmp_path / "x.csv")
    with pytest.raises(InputError, match=r"--pair-batches: \[5\] not among --batch-sizes"):
        run_profile(_spec(tiny_onnx, instances=2, pair_s=0.1, pair_batches=(1, 5)), tmp_path / "x.csv")
    proc = schedsim("profile", "--model", tiny_onnx, "--backend", "onnxruntime", "--out", tmp_path / "y.csv",
                    "--pair-s", "0.1", *FAST)
    assert_one_line_error(proc, "--pair-s", "--instances 2")
    assert not (tmp_path / "y.csv").exists()
