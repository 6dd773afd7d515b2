"""live owns its --out directory as run does; profile takes fixed dimensions from an ONNX model."""

from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import TRACE, assert_one_line_error, schedsim


def test_live_refuses_a_non_empty_out_before_any_engine_starts(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    proc = schedsim("live", TRACE, "--out", out, "--backend", "onnxruntime", "--model", "builtin:bert-tiny")
    assert_one_line_error(proc, "--out", "is not empty", "--overwrite")
    assert (out / "summary.json").read_text() == "{}"
    (tmp_path / "file").write_text("x")
    assert_one_line_error(schedsim("live", TRACE, "--out", tmp_path / "file"), "--out", "is a file")


@pytest.mark.parametrize("backend", ["torch", "torch-llm", "triton", "onnxruntime"])
def test_live_checks_its_numbers_for_every_backend_before_claiming_out(tmp_path, backend):
    proc = schedsim("live", TRACE, "--backend", backend, "--seed", "-1", "--out", tmp_path / "run")
    assert_one_line_error(proc, "--seed: -1 is not valid")
    assert not (tmp_path / "run").exists()


def test_live_overwrite_clears_the_earlier_run_first(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    # A bad flag after the directory is claimed: the old run's files are gone, the user's stay.
    proc = schedsim("live", TRACE, "--out", out, "--overwrite", "--backend", "nope")
    assert_one_line_error(proc, "--backend")
    assert not (out / "summary.json").exists() and (out / "notes.txt").read_text() == "mine"


def _mlp(path, batch_dim):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((256, 16), np.float32), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 16])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mlp", [x], [y], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_profile_takes_an_mlps_fixed_feature_size_from_the_model(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _mlp(tmp_path / "mlp.onnx", "batch")
    out = tmp_path / "mlp.csv"
    proc = schedsim("profile", "--model", model, "--backend", "onnxruntime", "--batch-sizes", "1,2",
                    "--min-time-s", "0.02", "--warmup-ms", "2", "--min-iters", "3", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "no dynamic sequence axis" in proc.stderr and "recorded as seq_len 256" in proc.stderr
    assert "Traceback" not in proc.stderr and out.exists()
    bad = schedsim("profile", "--model", model, "--backend", "onnxruntime", "--seq-lens", "128",
                   "--out", tmp_path / "x.csv")
    assert_one_line_error(bad, "--seq-lens 128", "no dynamic sequence axis", "leave --seq-lens out")


def test_profile_of_a_model_with_a_fixed_batch_is_one_line(tmp_path):
    model = _mlp(tmp_path / "fixed.onnx", 4)
    proc = schedsim("profile", "--model", model, "--backend", "onnxruntime", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "no dynamic batch axis", "[4, 256]")
