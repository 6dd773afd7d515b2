"""The builtin BERT-like encoders in numpy: what a KIND_CPU Triton model runs where PyTorch is absent.

Same architecture and shapes as :mod:`schedsim.live.engines.torch_encoder` (post-LayerNorm
layers, GELU feed-forward, tanh pooler; a test checks the shapes agree), with seeded random
weights from ``numpy.random.default_rng(seed)``: a batch's cost depends on its shape, not on
what the weights learned. float32 throughout.
"""

from __future__ import annotations

import numpy as np

SHAPES = {  # name: (layers, hidden, heads, ffn), as torch_encoder.CONFIGS
    "bert-base": (12, 768, 12, 3072),
    "bert-tiny": (2, 128, 2, 512),
}
VOCAB, MAX_POSITIONS, EPS = 30522, 512, 1e-12


def _layer_norm(x: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS)


def _gelu(x: np.ndarray) -> np.ndarray:
    # tanh approximation; x * x * x rather than x ** 3, which numpy computes with pow().
    return 0.5 * x * (1.0 + np.tanh(x * (0.7978845608 + 0.0356774081 * x * x)))


class NumpyEncoder:
    """``infer(ids) -> [batch, hidden]`` float32 for int64 token ids of shape [batch, seq_len]."""

    def __init__(self, name: str = "bert-tiny", seed: int = 0):
        if name not in SHAPES:
            raise ValueError(f"encoder name {name!r} is not known; valid names: {sorted(SHAPES)}")
        self.layers, self.hidden, self.heads, self.ffn = SHAPES[name]
        self.max_seq_len = MAX_POSITIONS
        self.vocab = VOCAB
        rng = np.random.default_rng(seed)
        h, f = self.hidden, self.ffn

        def w(*shape):
            return rng.normal(0.0, 0.02, shape).astype(np.float32)

        self.word, self.position, self.token_type = w(VOCAB, h), w(MAX_POSITIONS, h), w(h)
        self.weights = [(w(h, 3 * h), w(h, h), w(h, f), w(f, h)) for _ in range(self.layers)]
        self.pooler = w(h, h)

    def infer(self, ids: np.ndarray) -> np.ndarray:
        b, s = ids.shape
        h, nh = self.hidden, self.heads
        x = _layer_norm(self.word[ids] + self.position[:s] + self.token_type)
        for qkv_w, out_w, in_w, ffn_w in self.weights:
            # Contiguous heads: numpy's stacked matmul calls BLAS only on contiguous operands.
            q, k, v = np.ascontiguousarray((x @ qkv_w).reshape(b, s, 3, nh, h // nh).transpose(2, 0, 3, 1, 4))
            scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / np.sqrt(h // nh, dtype=np.float32)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            a = (scores / scores.sum(-1, keepdims=True)) @ v
            x = _layer_norm(x + a.transpose(0, 2, 1, 3).reshape(b, s, h) @ out_w)
            x = _layer_norm(x + _gelu(x @ in_w) @ ffn_w)
        return np.tanh(x[:, 0] @ self.pooler).astype(np.float32, copy=False)
