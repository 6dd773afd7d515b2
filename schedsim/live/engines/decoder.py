"""A Llama-like decoder-only transformer with random weights, for LLM iteration profiles.

Pre-norm layers of RMSNorm, grouped-query attention with rotary position embeddings
(RoPE, rotate-half form as in Llama), and a SwiGLU feed-forward block; tied input and
output embeddings. A static KV cache (:class:`KVCache`) lets the same module time a
prefill (many tokens, empty cache) and a decode step (one token per sequence, cache
filled to ``start``).

``forward(input_ids)`` returns the logits of the last position only, [batch, vocab]:
what a serving loop samples from, and what keeps a 128k-vocabulary output small. With
``out_features`` set to the vocabulary, :class:`~schedsim.live.engines.torch_encoder.TorchEncoderRunner`
times prefills of it like an encoder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a Llama-like decoder."""

    layers: int
    """Transformer layers."""
    hidden: int
    """Model width."""
    heads: int
    """Query heads; ``hidden`` must be divisible by it."""
    kv_heads: int
    """Key/value heads (grouped-query attention); ``heads`` must be divisible by it."""
    ffn: int
    """Inner size of the SwiGLU block."""
    vocab: int = 128256
    """Vocabulary size (Llama 3's)."""
    max_positions: int = 4096
    """Longest sequence (prompt plus generated tokens) the runner and cache allow."""
    rope_theta: float = 500000.0
    """RoPE base frequency (Llama 3's)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


CONFIGS: dict[str, DecoderConfig] = {
    # Llama 3.2 1B's shape: 16 layers, 2048 wide, 32 query / 8 KV heads, FFN 8192, tied
    # embeddings -> 1.24 B parameters.
    "llama-1b": DecoderConfig(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192),
    "llama-tiny": DecoderConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=512,
                                max_positions=256, rope_theta=10000.0),
}
# Draft models for speculative decoding: one layer of the target's shape and vocabulary (the
# size of an EAGLE or MTP head: about 1/16 of llama-1b's layers), a model of its own here.
CONFIGS["llama-1b-draft"] = replace(CONFIGS["llama-1b"], layers=1)
CONFIGS["llama-tiny-draft"] = replace(CONFIGS["llama-tiny"], layers=1)

DRAFT_MODELS: dict[str, str] = {"llama-1b": "llama-1b-draft", "llama-tiny": "llama-tiny-draft"}
"""The draft model the live engine runs beside each target for speculative decoding (same
vocabulary, so a draft token is a target token)."""

DESCRIPTIONS: dict[str, str] = {
    name: (f"{name} (Llama-like decoder: {c.layers} layer{'s' if c.layers != 1 else ''}, hidden {c.hidden}, {c.heads} "
           f"heads / {c.kv_heads} KV heads, SwiGLU FFN {c.ffn}, vocab {c.vocab}, random weights)")
    for name, c in CONFIGS.items()
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, as Llama does, then return to the input's dtype.
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(cfg: DecoderConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [max_positions, head_dim], float32 (frequencies repeated for rotate-half)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64,
                                                 device=device) / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.max_positions, dtype=torch.float64, device=device), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [batch, heads, seq, head_dim] by position tables cos/sin [seq, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    wide = torch.promote_types(x.dtype, torch.float32)  # at least float32, as Llama does
    return (x.to(wide) * cos + rotated.to(wide) * sin).to(x.dtype)


class KVCache:
    """Static per-layer key/value buffers [batch, kv_heads, max_positions, head_dim]."""

    def __init__(self, cfg: DecoderConfig, batch: int, device=None, dtype=torch.float32):
        shape = (batch, cfg.kv_heads, cfg.max_positions, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
            raise ValueError(f"hidden={cfg.hidden}, heads={cfg.heads}, kv_heads={cfg.kv_heads}: "
                             f"need hidden % heads == 0 and heads % kv_heads == 0")
        self.cfg = cfg
        d = cfg.head_dim
        self.q = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.o = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)

    def forward(self, x, cos, sin, cache_k=None, cache_v=None, start: int = 0):
        b, s, _ = x.shape
        c, d = self.cfg, self.cfg.head_dim
        q = self.q(x).view(b, s, c.heads, d).transpose(1, 2)
        k = self.k(x).view(b, s, c.kv_heads, d).transpose(1, 2)
        v = self.v(x).view(b, s, c.kv_heads, d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache_k is not None:
            cache_k[:, :, start:start + s] = k
            cache_v[:, :, start:start + s] = v
            k, v = cache_k[:, :, :start + s], cache_v[:, :, :start + s]
        # Each KV head serves heads / kv_heads query heads.
        rep = c.heads // c.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if start == 0:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # Query i sits at absolute position start + i and sees keys 0..start + i.
            total = start + s
            mask = (torch.arange(total, device=x.device)[None, :]
                    <= (start + torch.arange(s, device=x.device))[:, None])
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(a.transpose(1, 2).reshape(b, s, c.heads * d))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.gate = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x, cos, sin, cache_k=None, cache_v=None, start: int = 0):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache_k, cache_v, start)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    """Token embedding, layers, final RMSNorm, tied LM head."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.out_features = cfg.vocab
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None, start: int = 0,
                all_logits: bool = False) -> torch.Tensor:
        """Logits of the last position [batch, vocab] (every position with ``all_logits``)."""
        s = input_ids.shape[1]
        if start + s > self.cfg.max_positions:
            raise ValueError(f"positions {start}..{start + s - 1} exceed "
                             f"max_positions={self.cfg.max_positions}")
        cos = self.rope_cos[start:start + s].to(self.embed.weight.device)
        sin = self.rope_sin[start:start + s].to(self.embed.weight.device)
        x = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            ck = cache.k[i] if cache is not None else None
            cv = cache.v[i] if cache is not None else None
            x = layer(x, cos, sin, ck, cv, start)
        x = self.norm(x if all_logits else x[:, -1:])
        logits = x @ self.embed.weight.T  # tied embeddings
        return logits if all_logits else logits[:, 0]


def parameter_count(cfg: DecoderConfig) -> int:
    """Parameters of a decoder with this config (embeddings counted once: they are tied)."""
    d = cfg.head_dim
    attn = cfg.hidden * (cfg.heads * d) * 2 + cfg.hidden * (cfg.kv_heads * d) * 2
    per_layer = attn + 3 * cfg.hidden * cfg.ffn + 2 * cfg.hidden
    return cfg.vocab * cfg.hidden + cfg.layers * per_layer + cfg.hidden


def build_decoder(name: str, device="cpu", dtype=torch.float32, *, seed: int = 0) -> Decoder:
    """Build the named decoder with seeded random weights (normal(0, 0.02), unit norms)."""
    if name not in CONFIGS:
        raise ValueError(f"decoder name {name!r} is not known; valid names: {sorted(CONFIGS)}")
    cfg = CONFIGS[name]
    with torch.device("meta"):
        model = Decoder(cfg)
    model.to_empty(device="cpu")
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02, generator=g)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        cos, sin = rope_tables(cfg)
        model.rope_cos.copy_(cos)
        model.rope_sin.copy_(sin)
    model.requires_grad_(False)
    model = model.to(device=device, dtype=dtype).eval()
    # RoPE tables stay float32 for accuracy at long positions.
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    return model
