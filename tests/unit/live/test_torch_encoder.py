"""The builtin encoder and its runner: CPU eager here, the CUDA-graph path where a GPU is."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from schedsim.live.engines.torch_encoder import (CONFIGS, TorchEncoderRunner,  # noqa: E402
                                            build_encoder)


def _ids(rng, batch, seq_len):
    return rng.integers(0, CONFIGS["bert-tiny"].vocab, size=(batch, seq_len))


def test_bert_tiny_cpu_eager_shapes_and_finite():
    model = build_encoder("bert-tiny", "cpu", torch.float32, seed=0)
    rng = np.random.default_rng(0)
    with TorchEncoderRunner(model, max_batch=4, max_seq_len=16, cuda_graphs=True) as r:
        assert not r.cuda_graphs  # no graphs on the CPU, eager instead
        for batch, seq_len in [(1, 16), (4, 8), (3, 16)]:
            out = r.infer(batch, seq_len, _ids(rng, batch, seq_len))
            assert out.shape == (batch, 128)
            assert np.isfinite(out).all()
            assert r.last_done_ns >= r.last_issue_ns > 0
        assert np.isnan(r.last_gpu_ms)


def test_runner_matches_plain_forward_and_host_input_path():
    model = build_encoder("bert-tiny", "cpu", torch.float32, seed=0)
    ids = _ids(np.random.default_rng(1), 2, 12)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).numpy()
    with TorchEncoderRunner(model, max_batch=4, max_seq_len=16) as r:
        np.testing.assert_allclose(r.infer(2, 12, ids), ref, rtol=1e-5, atol=1e-6)
        r.host_input(2, 12)[:] = ids
        np.testing.assert_allclose(r.infer(2, 12), ref, rtol=1e-5, atol=1e-6)


def test_weights_are_seeded():
    a = build_encoder("bert-tiny", seed=3).state_dict()
    b = build_encoder("bert-tiny", seed=3).state_dict()
    c = build_encoder("bert-tiny", seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.qkv.weight"], c["layers.0.qkv.weight"])


def test_bad_name_and_shape_are_reported():
    with pytest.raises(ValueError, match="bert-base"):
        build_encoder("bert-huge")
    model = build_encoder("bert-tiny")
    with TorchEncoderRunner(model, max_batch=2, max_seq_len=8) as r:
        with pytest.raises(ValueError, match="batch=3"):
            r.infer(3, 8, np.zeros((3, 8), dtype=np.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_matches_eager_fp16():
    model = build_encoder("bert-tiny", "cuda", torch.float16, seed=0)
    rng = np.random.default_rng(2)
    shapes = [(1, 32), (5, 32), (8, 16)]
    inputs = {s: _ids(rng, *s) for s in shapes}
    with TorchEncoderRunner(model, max_batch=8, max_seq_len=32, cuda_graphs=False) as eager:
        want = {s: eager.infer(*s, inputs[s]).copy() for s in shapes}
    with TorchEncoderRunner(model, max_batch=8, max_seq_len=32, cuda_graphs=True,
                            record_gpu_time=True) as graphs:
        for s in shapes:
            graphs.prepare(*s)
        assert sorted(graphs.graph_shapes) == sorted(shapes), graphs.warnings
        for _ in range(2):  # replays reuse the static buffers: inputs must be fresh each time
            for s in shapes:
                got = graphs.infer(*s, inputs[s])
                assert got.dtype == np.float16 and got.shape == (s[0], 128)
                np.testing.assert_allclose(got.astype(np.float32),
                                           want[s].astype(np.float32), rtol=1e-2, atol=2e-3)
                assert graphs.last_gpu_ms > 0
