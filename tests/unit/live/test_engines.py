"""Builtin models and runners: ONNX builder, export, ONNX Runtime runner, the Llama-like decoder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from schedsim.live.engines.onnx_export import inspect_onnx, make_encoder_onnx  # noqa: E402
from schedsim.live.engines.ort_runner import OrtRunner, converted_model  # noqa: E402
from schedsim.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_encoder_onnx(tmp_path_factory.mktemp("m") / "t.onnx", layers=1, hidden=32,
                             heads=4, ffn=64, vocab=300, max_positions=64)


def test_builder_model_has_dynamic_axes_and_its_vocabulary(tiny):
    info = inspect_onnx(tiny)
    (spec,) = info.inputs
    assert spec.name == "input_ids" and spec.dims == (None, None) and spec.seq_axis == 1
    assert spec.vocab == 300 and info.outputs == ("pooled",) and len(info.sha256) == 64


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_ort_runner_runs_every_shape(tiny, tmp_path, precision):
    info = inspect_onnx(tiny)
    path = converted_model(info, precision, tmp_path)
    with OrtRunner(info, path, provider="CPUExecutionProvider") as r:
        for b, s in [(1, 4), (3, 17)]:
            r.prepare(b, s)
            out = r.infer(b, s)
            assert out.shape == (b, 32) and np.isfinite(out).all()
            assert r.host_input(b, s).shape == (b, s)
        assert np.isnan(r.last_gpu_ms)


def test_ort_refuses_bf16(tiny, tmp_path):
    with pytest.raises(InputError, match="bf16"):
        converted_model(inspect_onnx(tiny), "bf16", tmp_path)


def test_builder_matches_a_numpy_reference(tiny):
    """The onnx.helper graph computes BERT's layer (checked with the ONNX reference evaluator)."""
    from onnx.reference import ReferenceEvaluator

    ids = np.random.default_rng(0).integers(0, 300, size=(2, 5))
    ref = ReferenceEvaluator(str(tiny)).run(None, {"input_ids": ids})[0]
    got = ort.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# -- torch parts (skipped without torch) ------------------------------------------------------

def test_exported_builtin_matches_the_torch_module(tmp_path):
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.onnx_export import export_builtin
    from schedsim.live.engines.torch_encoder import build_encoder

    path = export_builtin("bert-tiny", tmp_path / "bt.onnx")
    info = inspect_onnx(path)
    assert info.inputs[0].dims == (None, None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = build_encoder("bert-tiny")
    for b, s in [(1, 8), (5, 33)]:  # shapes other than the export's (2, 16)
        ids = np.random.default_rng(b).integers(1000, 30522, size=(b, s))
        with torch.no_grad():
            ref = model(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(sess.run(None, {"input_ids": ids})[0], ref, atol=1e-5)


def test_decoder_cache_matches_full_forward():
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.decoder import KVCache, build_decoder

    model = build_decoder("llama-tiny", dtype=torch.float64)
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids, all_logits=True)
        cache = KVCache(model.cfg, 2, dtype=torch.float64)
        first = model(ids[:, :8], cache=cache, start=0)
        steps = [model(ids[:, i:i + 1], cache=cache, start=i) for i in range(8, 12)]
    torch.testing.assert_close(first, full[:, 7])
    for i, step in zip(range(8, 12), steps):
        torch.testing.assert_close(step, full[:, i])


def test_decoder_is_causal_and_rope_is_relative():
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.decoder import CONFIGS, apply_rope, build_decoder, rope_tables

    model = build_decoder("llama-tiny", dtype=torch.float64)
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 9] = (changed[0, 9] + 1) % 512
    with torch.no_grad():
        a, b = model(ids, all_logits=True), model(changed, all_logits=True)
    torch.testing.assert_close(a[:, :9], b[:, :9])  # earlier positions cannot see the last
    cos, sin = rope_tables(CONFIGS["llama-tiny"])
    gen = torch.Generator().manual_seed(2)   # not the global stream: the result must not depend on test order
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64, generator=gen)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64, generator=gen)

    def score(i, j):
        return (apply_rope(q, cos[i:i + 1].double(), sin[i:i + 1].double())
                * apply_rope(k, cos[j:j + 1].double(), sin[j:j + 1].double())).sum()

    # Depends on i - j only, to the float32 tables' precision (a float64 tolerance failed 3e-7
    # apart for some draws of the global stream).
    torch.testing.assert_close(score(5, 2), score(40, 37), rtol=1e-6, atol=1e-6)


def test_llama_1b_size_and_tiny_count():
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.decoder import CONFIGS, build_decoder, parameter_count

    assert 1.2e9 < parameter_count(CONFIGS["llama-1b"]) < 1.3e9
    model = build_decoder("llama-tiny")
    assert sum(p.numel() for p in model.parameters()) == parameter_count(CONFIGS["llama-tiny"])


def test_runner_times_decoder_prefill_on_cpu():
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.decoder import build_decoder
    from schedsim.live.engines.torch_encoder import TorchEncoderRunner

    model = build_decoder("llama-tiny")
    with TorchEncoderRunner(model, max_batch=3, max_seq_len=16) as r:
        out = r.infer(2, 16, np.random.default_rng(0).integers(0, 512, size=(2, 16)))
        assert out.shape == (2, 512) and np.isfinite(out).all()


@pytest.mark.gpu
def test_torch_cuda_graph_profile_on_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from schedsim.cost.profile import load_profile
    from schedsim.profiling.profiler import ProfileSpec, run_profile

    spec = ProfileSpec(model="builtin:bert-tiny", backend="torch", precision="fp16",
                       batch_sizes=(1, 2, 4), seq_lens=(16, 32), cuda_graphs=True, instances=2,
                       warmup_ms=5, min_iters=10, min_time_s=0.0, dispatch_iters=20)
    run_profile(spec, tmp_path / "g.csv")
    prof = load_profile(tmp_path / "g.csv")
    assert prof.meta["cuda_graphs"] and prof.meta["instances"] == 2
    assert (prof.table["gpu_ms_mean"] > 0).all()
    assert (prof.table["gpu_ms_mean"] <= prof.table["latency_ms_mean"]).all()
