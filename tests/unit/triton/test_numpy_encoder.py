"""The numpy encoder a KIND_CPU Triton model runs: the torch encoder's shapes, deterministic output."""

import numpy as np
import pytest

from schedsim.triton.numpy_encoder import SHAPES, NumpyEncoder


def test_shapes_are_the_torch_encoders():
    torch_encoder = pytest.importorskip("schedsim.live.engines.torch_encoder")
    assert {n: (c.layers, c.hidden, c.heads, c.ffn) for n, c in torch_encoder.CONFIGS.items()} == SHAPES


def test_output_is_pooled_float32_and_seeded():
    ids = np.random.default_rng(1).integers(0, 30522, (3, 16))
    a, b = NumpyEncoder("bert-tiny", seed=4), NumpyEncoder("bert-tiny", seed=4)
    out = a.infer(ids)
    assert out.shape == (3, 128) and out.dtype == np.float32 and np.isfinite(out).all()
    assert np.array_equal(out, b.infer(ids))
    # Rows are independent: a request's output does not depend on its batch mates.
    assert np.allclose(a.infer(ids[1:2]), out[1:2], atol=1e-5)
    with pytest.raises(ValueError, match="bert-huge"):
        NumpyEncoder("bert-huge")
