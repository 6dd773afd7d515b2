"""A paged-KV LLM engine: the random-weight decoder of :mod:`~schedsim.live.engines.decoder`, one step at a time.

:class:`PagedLLMEngine` runs what an iteration-level server runs: one forward pass over the
tokens a scheduler picked for this step (prefill chunks of some requests, one token of
each decoding request), reading and writing a paged key/value cache. It is the engine
that :mod:`schedsim.profiling.step_profiler` measures and a live LLM driver would call; it
decides nothing itself, and measures nothing: the caller times it.

The KV cache is one pool per layer, ``[num_blocks, block_size, kv_heads, head_dim]`` for K
and for V (held as one tensor, so a swap copies a block of every layer at once). Block 0
is the null block: no request owns it; padded rows and padded table entries point at it.
A step's new tokens are written into their slots first, then attention reads them back:

- a prefill chunk (a row of more than one token) is one SDPA call over its row's context
  plus the chunk, causal with the offset (a lower-right causal mask); a chunk with no
  context attends to its own fresh keys and reads nothing back;
- decodes (rows of one token) are batched: each row's blocks are gathered into a padded
  ``[rows, width * block_size, kv_heads, head_dim]`` and one SDPA call with a length mask
  serves them all; the query heads sharing a KV head ride as that head's query rows, so
  grouped-query attention needs no copy of K and V.

The linear layers run packed over all of a step's tokens, ``[tokens, hidden]``. A
decode-only step replays a CUDA graph captured lazily per (padded batch, key/value width)
of :mod:`schedsim.cost.llm_shapes` (static inputs; padded rows write into the null block);
other steps run eagerly. The step returns the greedy next token of every row (the argmax
of its last position's logits): lengths are the caller's business, no EOS is looked for.

A runner in the house style: a context manager owning its pool, staging buffers, stream,
events and graphs. Weights are the seeded random weights of ``build_decoder``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from schedsim.live.engines.decoder import (CONFIGS, Decoder, DecoderConfig, apply_rope, build_decoder,
                                      rope_tables)
from schedsim.live.engines.llm_rows import NULL_BLOCK, EngineRow  # noqa: F401  (re-exported)
from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES, context_blocks, graph_batch

# A builtin: no inspect.signature; its docstring carries the signature (torch >= 2.5 has it).
_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def _sdpa_backends(graph: bool):
    """The SDPA kernels a step may use: any for a captured decode graph, never cuDNN eagerly.

    On the H200 (torch 2.11) SDPA picks cuDNN attention for a causal prefill, and cuDNN
    builds an execution plan for every new shape: about 45 ms of host time (a 490-token
    chunk took 57 ms the first time, 6.5 ms after; flash: 11 ms, then 7.7). An eager step
    meets a new shape at nearly every prefill, so the plan cost would land on most of them
    (experiments/fidelity-llm/diagnose_first_call.py). A decode graph is captured once per
    shape, and there cuDNN's masked attention is 1.5-2.3x faster than the memory-efficient
    kernel for batches over 4 (fidelity-llm run 3), so graphs keep it.
    """
    if graph:
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: no cuDNN attention in SDPA either
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@dataclass(eq=False)
class SwapHandle:
    """KV blocks copied to host memory by :meth:`PagedLLMEngine.swap_out`."""

    data: torch.Tensor
    """[layers, 2, blocks, block_size, kv_heads, head_dim] on the host (pinned on CUDA)."""

    @property
    def num_blocks(self) -> int:
        return int(self.data.shape[2])


@dataclass(eq=False)
class _Prepared:
    """A step's inputs, packed on the host: one int64 array copied to the device at once."""

    host: np.ndarray
    """Packed int64 inputs (a view of the pinned staging buffer)."""
    host_t: torch.Tensor
    """The same memory as a (pinned) tensor, for the copy to the device."""
    rows: int
    tokens: int
    graph_key: tuple[int, int] | None
    """(padded batch, width in blocks) of a decode-only step run through a graph."""
    width: int
    """Key/value width of the decode gather, in blocks."""
    decodes: int
    """Rows decoding (one token) this step."""
    decode_only: bool
    """Every row decodes: token i is row i (plus padded rows under a graph)."""
    prefills: list
    """(first token, tokens, context, first table entry, table entries) of each prefill row."""
    offsets: dict
    """Name -> (start, stop) of each input inside ``host``."""


@dataclass(eq=False)
class _Graph:
    graph: object
    inputs: torch.Tensor
    """Static device buffer the replay reads: ids, pos, slot, lens, tables."""
    logits: torch.Tensor
    next_tokens: torch.Tensor


class PagedLLMEngine:
    """Run LLM steps over a paged KV cache; see the module docstring.

    ``cfg`` names a builtin decoder (``"llama-1b"``, ``"llama-tiny"``) or is one of their
    :class:`DecoderConfig`\\ s; pass ``model`` to serve an already built
    :class:`Decoder` (its weights are shared, not copied). ``max_context`` is the longest
    request (context plus new tokens) the RoPE tables cover (default: the config's
    ``max_positions``). ``cuda_graphs`` only matters on CUDA.

    After each :meth:`execute`: ``last_logits`` holds the rows' last-position logits (a
    device tensor, valid until the next step), ``last_gpu_ms`` the CUDA-event time from
    the input copy to the output copy (NaN on the CPU), and ``last_graph`` whether a
    graph was replayed.
    """

    def __init__(self, cfg: str | DecoderConfig, num_blocks: int, block_size: int = 16,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 cuda_graphs: bool = True, seed: int = 0, *, max_context: int | None = None,
                 model: Decoder | None = None,
                 graph_batch_sizes: tuple[int, ...] = CUDA_GRAPH_BATCH_SIZES,
                 decode_split_ctas: int = 256, min_split_blocks: int = 16):
        if isinstance(cfg, str):
            if cfg not in CONFIGS:
                raise ValueError(f"cfg={cfg!r} is not a builtin decoder; valid names: {sorted(CONFIGS)}")
            self.name, cfg = cfg, CONFIGS[cfg]
        else:
            self.name = next((n for n, c in CONFIGS.items() if c == cfg), None)
            if self.name is None and model is None:
                raise ValueError(f"cfg={cfg} is not a builtin config; pass model= (a built Decoder) "
                                 f"or one of {sorted(CONFIGS)}")
        if model is not None and model.cfg != cfg:
            raise ValueError(f"model's config {model.cfg} differs from cfg={cfg}")
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks} must be >= 2 (block 0 is the reserved null block)")
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        self.cfg = cfg
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed
        self.max_context = int(max_context or cfg.max_positions)
        self.is_cuda = self.device.type == "cuda"
        self.cuda_graphs = bool(cuda_graphs) and self.is_cuda
        self.graph_batch_sizes = tuple(graph_batch_sizes)
        self.decode_split_ctas = int(decode_split_ctas)
        self.min_split_blocks = max(int(min_split_blocks), 1)
        self._given_model = model
        self.warnings: list[str] = []
        """Messages worth a profile's sidecar (a graph capture that fell back to eager)."""
        self.last_logits: torch.Tensor | None = None
        self.last_graph = False
        self._open = False

    # -- lifetime -------------------------------------------------------------------
    def __enter__(self) -> "PagedLLMEngine":
        cfg = self.cfg
        if self._given_model is not None:
            self.model = self._given_model
        else:
            self.model = build_decoder(self.name, self.device, self.dtype, seed=self.seed)
        p = next(self.model.parameters())
        if p.device != self.device and not (self.device.type == "cuda" and p.device.type == "cuda"):
            raise ValueError(f"model is on {p.device}, engine device is {self.device}")
        self.device, self.dtype = p.device, p.dtype
        # Packed projections: one GEMM for Q, K and V, one for gate and up (fewer launches).
        layers = self.model.layers
        self._qkv = [torch.cat([l.attn.q.weight, l.attn.k.weight, l.attn.v.weight]) for l in layers]
        self._gate_up = [torch.cat([l.gate.weight, l.up.weight]) for l in layers]
        cos, sin = rope_tables(replace(cfg, max_positions=self.max_context), self.device)
        self._cos, self._sin = cos, sin
        # One tensor for all layers: [layers, K/V, blocks, block_size, kv_heads, head_dim].
        self.kv = torch.zeros((cfg.layers, 2, self.num_blocks, self.block_size, cfg.kv_heads,
                               cfg.head_dim), device=self.device, dtype=self.dtype)
        self._pin = self.is_cuda
        # Two staging buffers, used in turn: a step can be packed while the one before runs.
        self._host_in = [torch.zeros(1 << 12, dtype=torch.int64, pin_memory=self._pin) for _ in range(2)]
        self._stage = 0
        self._host_out = torch.zeros(1 << 8, dtype=torch.int64, pin_memory=self._pin)
        self._graphs: dict[tuple[int, int], _Graph | None] = {}
        self._gqa_lower_right = _flash_gqa_lower_right(cfg, self.device, self.dtype)
        if self.is_cuda:
            self._stream = torch.cuda.Stream(device=self.device)
            self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
            self._ev_start = torch.cuda.Event(enable_timing=True)
            self._ev_end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)  # the pool, made on the default stream, is ready
        self._open = True
        return self

    def __exit__(self, *exc) -> None:
        if self.is_cuda and self._open:
            self._stream.synchronize()
        self._graphs = {}
        self.kv = self._host_in = self._host_out = self.last_logits = None
        self._stream = self._pool = self._ev_start = self._ev_end = None
        self._cos = self._sin = self._qkv = self._gate_up = None
        if self._given_model is None:
            self.model = None
        self._open = False

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.cfg
        return 2 * c.layers * c.kv_heads * c.head_dim * torch.finfo(self.dtype).bits // 8

    # -- inputs ---------------------------------------------------------------------
    def _staging(self, n: int) -> torch.Tensor:
        i, self._stage = self._stage, self._stage ^ 1
        if self._host_in[i].numel() < n:
            self._host_in[i] = torch.zeros(1 << (n - 1).bit_length(), dtype=torch.int64,
                                           pin_memory=self._pin)
        return self._host_in[i][:n]

    def prepare(self, rows: Sequence[EngineRow]) -> _Prepared:
        """Pack a step's rows into a staging buffer (host work only; :meth:`execute` calls it).

        The two staging buffers are used in turn, so one step may be packed while the step
        packed before it runs (:meth:`run` on another thread); a third would overwrite the
        running step's inputs.

        Layout: ids, pos, slot (one per token), last (one per row), then for the decode
        rows lens (context + 1) and a [decodes, width] block table padded with the null
        block, then the prefill rows' block tables. A decode-only step under graphs pads
        the batch to the captured size (padded rows: token 0 at position 0 in the null
        block, length 1) and the width to :func:`~schedsim.cost.llm_shapes.context_blocks`.
        """
        if not self._open:
            raise RuntimeError("PagedLLMEngine used outside its `with` block")
        n_rows = len(rows)
        if n_rows == 0:
            raise ValueError("a step needs at least one row")
        bs = self.block_size
        tokens = [np.asarray(r.tokens, dtype=np.int64).reshape(-1) for r in rows]
        tables = [np.asarray(r.block_table, dtype=np.int64).reshape(-1) for r in rows]
        n_tok = np.fromiter((t.size for t in tokens), np.int64, n_rows)
        ctx = np.fromiter((int(r.context) for r in rows), np.int64, n_rows)
        if (n_tok < 1).any() or (ctx < 0).any():
            i = int(np.flatnonzero((n_tok < 1) | (ctx < 0))[0])
            raise ValueError(f"row {i}: tokens={n_tok[i]} must be >= 1 and context={ctx[i]} >= 0")
        end = ctx + n_tok
        if end.max() > self.max_context:
            i = int(end.argmax())
            raise ValueError(f"row {i}: context {ctx[i]} + {n_tok[i]} tokens exceeds "
                             f"max_context={self.max_context}")
        need = -(-end // bs)
        for i, t in enumerate(tables):
            if t.size < need[i]:
                raise ValueError(f"row {i}: block_table has {t.size} blocks, {need[i]} needed for "
                                 f"{end[i]} tokens at block_size={bs}")
            if t.size and (t[:need[i]].min() < 0 or t[:need[i]].max() >= self.num_blocks):
                raise ValueError(f"row {i}: block ids must be in 0..{self.num_blocks - 1}")
        is_dec = n_tok == 1
        n_dec = int(is_dec.sum())
        decode_only = n_dec == n_rows
        max_dec_ctx = int(ctx[is_dec].max()) + 1 if n_dec else 0
        graph_key = None
        if decode_only and self.cuda_graphs:
            gb = graph_batch(n_rows, self.graph_batch_sizes)
            if gb:
                graph_key = (gb, context_blocks(max_dec_ctx, bs))
        if graph_key is not None:
            b_pad, width = graph_key
        else:
            b_pad, width = n_dec, (-(-max_dec_ctx // bs) if n_dec else 0)
        t_pad = b_pad if decode_only else int(n_tok.sum())
        pre_rows = np.flatnonzero(~is_dec)
        # A decode-only step's token i is row i: no "last" or "dec_tok" indices, so the
        # layout depends on the graph key alone.
        sizes = {"ids": t_pad, "pos": t_pad, "slot": t_pad,
                 "last": 0 if decode_only else n_rows, "dec_tok": 0 if decode_only else n_dec,
                 "lens": b_pad, "tables": b_pad * width, "pre_tables": int(need[pre_rows].sum())}
        offsets, at = {}, 0
        for k, n in sizes.items():
            offsets[k] = (at, at + n)
            at += n
        host_t = self._staging(at)
        host = host_t.numpy()
        host[:] = 0
        view = {k: host[a:b] for k, (a, b) in offsets.items()}
        # Every token's position and slot, vectorized over the concatenated block tables.
        starts = np.cumsum(n_tok) - n_tok
        t_len = np.fromiter((t.size for t in tables), np.int64, n_rows)
        t_start = np.cumsum(t_len) - t_len
        flat = np.concatenate(tables)
        ids = np.concatenate(tokens)
        row_of = np.repeat(np.arange(n_rows), n_tok)
        pos = ctx[row_of] + np.arange(ids.size) - starts[row_of]
        n = ids.size
        view["ids"][:n] = ids
        view["pos"][:n] = pos
        view["slot"][:n] = flat[t_start[row_of] + pos // bs] * bs + pos % bs
        # Padded graph rows keep id 0, position 0, slot 0 (the null block's first slot), length 1.
        if not decode_only:
            view["last"][:] = starts + n_tok - 1
        dec_rows = np.flatnonzero(is_dec)
        if not decode_only:
            view["dec_tok"][:] = starts[dec_rows]
        view["lens"][:] = 1
        view["lens"][:n_dec] = ctx[dec_rows] + 1
        if n_dec:
            tab = view["tables"].reshape(b_pad, width)[:n_dec]
            cols = np.arange(width)
            inside = cols[None, :] < need[dec_rows][:, None]
            tab[inside] = flat[(t_start[dec_rows][:, None] + cols[None, :])[inside]]
        prefills, at = [], 0
        pre_tab = view["pre_tables"]
        for i in pre_rows:
            nb = int(need[i])
            pre_tab[at:at + nb] = tables[i][:nb]
            prefills.append((int(starts[i]), int(n_tok[i]), int(ctx[i]), at, nb))
            at += nb
        return _Prepared(host, host_t, n_rows, int(n_tok.sum()), graph_key, width, n_dec, decode_only,
                         prefills, offsets)

    # -- the forward pass -----------------------------------------------------------
    def _sdpa(self, q, k, v, *, mask=None, causal=False):
        """SDPA with K/V heads fewer than query heads (grouped-query attention)."""
        rep = q.shape[1] // k.shape[1]
        if rep > 1 and not _HAS_GQA:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        extra = {"enable_gqa": True} if rep > 1 and _HAS_GQA else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **extra)

    def _attention(self, layer: int, attn, h, cos, sin, inp: dict, p: _Prepared):
        c = self.cfg
        d, kvh, heads = c.head_dim, c.kv_heads, c.heads
        t = h.shape[0]
        qkv = F.linear(h, self._qkv[layer]).view(t, heads + 2 * kvh, d)
        qk = apply_rope(qkv[:, :heads + kvh], cos, sin)      # Q and K rotated together
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kvh:]
        pool_k, pool_v = self.kv[layer, 0], self.kv[layer, 1]
        pool_k.view(-1, kvh, d).index_copy_(0, inp["slot"], k)
        pool_v.view(-1, kvh, d).index_copy_(0, inp["slot"], v)
        decode_only = p.decode_only
        out = None if decode_only else torch.empty(t, heads * d, device=h.device, dtype=h.dtype)
        if p.decodes:
            b = inp["lens"].shape[0]
            tables = inp["tables"].view(b, p.width)
            width = p.width * self.block_size
            # The heads sharing a KV head attend as that head's query rows: [b, kvh, rep, d].
            qd = (q if decode_only else q[inp["dec_tok"]]).reshape(b, kvh, heads // kvh, d)
            kg = pool_k[tables].view(b, width, kvh, d)
            vg = pool_v[tables].view(b, width, kvh, d)
            o = self._decode_attention(qd, kg, vg, inp["lens"], p.width).reshape(b, heads * d)
            if decode_only:
                out = o
            else:
                out.index_copy_(0, inp["dec_tok"], o)
        for s, n, ctx, at, nb in p.prefills:
            qp = q[s:s + n].transpose(0, 1)[None]
            if ctx == 0:
                kp, vp = k[s:s + n].transpose(0, 1)[None], v[s:s + n].transpose(0, 1)[None]
                o = self._sdpa(qp, kp, vp, causal=True)
            else:
                blocks = inp["pre_tables"][at:at + nb]
                total = ctx + n
                kp = pool_k[blocks].view(-1, kvh, d)[:total].transpose(0, 1)[None]
                vp = pool_v[blocks].view(-1, kvh, d)[:total].transpose(0, 1)[None]
                if not self._gqa_lower_right and heads != kvh:
                    kp = kp.repeat_interleave(heads // kvh, dim=1)
                    vp = vp.repeat_interleave(heads // kvh, dim=1)
                o = self._sdpa(qp, kp, vp, mask=_lower_right(n, total, h.device))
            out[s:s + n] = o[0].transpose(0, 1).reshape(n, heads * d)
        return attn.o(out)

    def decode_splits(self, batch: int, width_blocks: int) -> int:
        """Key/value segments a decode batch's attention is split into (1: one SDPA call).

        One fused-attention kernel runs a block of threads per (sequence, KV head): a
        small batch over a long context would keep a few of the GPU's multiprocessors
        busy. So, as flash-decoding does, the gathered keys are cut into segments that
        run as extra batch entries, and the segments' outputs are merged by their
        log-sum-exp, until about ``decode_split_ctas`` blocks run (segments of at least
        ``min_split_blocks`` blocks, a power of two of them dividing the width). Only
        batches of at most ``decode_split_ctas // 8`` (sequence, KV head) pairs split:
        on an H200 the split kernel moved about 20k KV tokens/ms at any split, the one
        SDPA call about 30k once 128 pairs ran, and less below (step profile, 2026-11-30).
        """
        s, kvh = 1, self.cfg.kv_heads
        if batch * kvh > self.decode_split_ctas // 8:
            return 1
        while (batch * kvh * s * 2 <= self.decode_split_ctas and width_blocks % (2 * s) == 0
               and width_blocks // (2 * s) >= self.min_split_blocks):
            s *= 2
        return s

    def _decode_attention(self, q, kg, vg, lens, width_blocks: int):
        """q [b, kvh, rep, d] over gathered K/V [b, width, kvh, d], the first lens[i] valid."""
        b, kvh, rep, d = q.shape
        width = kg.shape[1]
        pos = torch.arange(width, device=q.device)
        s = self.decode_splits(b, width_blocks)
        if s == 1:
            mask = (pos[None, :] < lens[:, None])[:, None, None, :]
            return F.scaled_dot_product_attention(q, kg.transpose(1, 2), vg.transpose(1, 2),
                                                  attn_mask=mask)
        seg = width // s
        k = kg.view(b * s, seg, kvh, d).transpose(1, 2)
        v = vg.view(b * s, seg, kvh, d).transpose(1, 2)
        qs = q.unsqueeze(1).expand(b, s, kvh, rep, d).reshape(b * s, kvh, rep, d)
        valid = (pos.view(s, seg)[None] < lens[:, None, None]).view(b * s, 1, 1, seg)
        if self.is_cuda:
            bias = torch.zeros(valid.shape, device=q.device, dtype=q.dtype)
            bias = bias.masked_fill_(~valid, float("-inf")).expand(b * s, kvh, rep, seg)
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(qs, k, v, bias, True)[:2]
            lse = lse[:, :, :rep]
        else:  # the same merge, with the segments' attention in plain float32 math
            scores = (qs.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
            scores = scores.masked_fill(~valid, float("-inf"))
            lse = torch.logsumexp(scores, -1)
            out = torch.softmax(scores, -1) @ v.float()
        # A segment wholly past a row's length has no keys: weight 0 (its output may be NaN).
        seg_ok = valid[:, 0, 0, 0].view(b, s)
        lse = lse.float().view(b, s, kvh, rep).masked_fill(~seg_ok[:, :, None, None], float("-inf"))
        weight = torch.softmax(lse, dim=1).unsqueeze(-1)
        out = torch.where(seg_ok[:, :, None, None, None], out.float().view(b, s, kvh, rep, d), 0.0)
        return (weight * out).sum(1).to(q.dtype)

    def _forward(self, inp: dict, p: _Prepared, graph: bool = False) -> torch.Tensor:
        """Logits of each row's last token [rows (padded), vocab]; no host syncs (graph-safe).

        ``graph``: for a CUDA graph's capture (and its warm-up), which may use cuDNN attention."""
        m = self.model
        pos = inp["pos"]
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        x = m.embed(inp["ids"])
        with _sdpa_backends(graph):
            for i, layer in enumerate(m.layers):
                x = x + self._attention(i, layer.attn, _rms_norm(x, layer.attn_norm), cos, sin, inp, p)
                gate, up = F.linear(_rms_norm(x, layer.ffn_norm), self._gate_up[i]).chunk(2, dim=-1)
                x = x + layer.down(F.silu(gate) * up)
        if not p.decode_only:
            x = x[inp["last"]]
        return _rms_norm(x, m.norm) @ m.embed.weight.T

    def _views(self, dev: torch.Tensor, p: _Prepared) -> dict:
        return {k: dev[a:b] for k, (a, b) in p.offsets.items()}

    # -- the step -------------------------------------------------------------------
    def execute(self, rows: Sequence[EngineRow]) -> np.ndarray:
        """Run one step; return each row's greedy next token (int64, a fresh array).

        Blocks until the step is done (the output is on the host).
        """
        return self.run(self.prepare(rows))

    @staticmethod
    def set_tokens(p: _Prepared, index, values) -> None:
        """Write token ids into a packed step before it runs: ``index`` counts the step's
        tokens in row order (row i's j-th token is ``sum(tokens of rows before i) + j``).
        A driver preparing a step while the one before runs packs the tokens that step
        will generate as placeholders and writes them here once they are known."""
        a, _ = p.offsets["ids"]
        p.host[a + np.asarray(index, np.int64)] = values

    def run(self, p: _Prepared) -> np.ndarray:
        """Run a step packed by :meth:`prepare`; return each row's greedy next token.

        Blocks until the step is done; may run on another thread than :meth:`prepare`."""
        n = p.rows
        if self._host_out.numel() < n:
            self._host_out = torch.zeros(1 << (n - 1).bit_length(), dtype=torch.int64,
                                         pin_memory=self._pin)
        host_in = p.host_t
        host_out = self._host_out[:n]
        # Inference mode, as serving engines run (vLLM's model runner does), and as the step
        # profiler has always measured: an eager step launches hundreds of small kernels from
        # Python, and autograd's view and version tracking under plain no_grad costs host time
        # on each of them.
        with torch.inference_mode():
            if not self.is_cuda:
                logits = self._forward(self._views(host_in.to(self.device), p), p)
                host_out.copy_(logits.argmax(-1))
                self.last_logits, self.last_graph = logits, False
                return host_out.numpy().copy()
            g = self._graph(p) if p.graph_key is not None else None
            with torch.cuda.stream(self._stream):
                self._ev_start.record(self._stream)
                if g is not None:
                    g.inputs.copy_(host_in, non_blocking=True)
                    g.graph.replay()
                    logits, next_tok = g.logits, g.next_tokens
                else:
                    dev = host_in.to(self.device, non_blocking=True)
                    logits = self._forward(self._views(dev, p), p)
                    next_tok = logits.argmax(-1)
                host_out.copy_(next_tok[:n], non_blocking=True)
                self._ev_end.record(self._stream)
            self._stream.synchronize()
            self.last_logits, self.last_graph = logits[:n], g is not None
        return host_out.numpy().copy()

    def _graph(self, p: _Prepared) -> _Graph | None:
        """The graph of a decode-only shape, captured on first use (None: run eagerly)."""
        key = p.graph_key
        if key in self._graphs:
            return self._graphs[key]
        size = p.host.size
        # Capture with a harmless input: every row a padded row (null block, length 1).
        dummy = np.zeros(size, np.int64)
        a, b = p.offsets["lens"]
        dummy[a:b] = 1
        inputs = torch.from_numpy(dummy).to(self.device)
        views = self._views(inputs, p)
        torch.cuda.synchronize(self.device)
        try:
            with torch.inference_mode():
                with torch.cuda.stream(self._stream):
                    self._forward(views, p, graph=True).argmax(-1)  # warm-up: kernel choice, workspaces
                self._stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                    logits = self._forward(views, p, graph=True)
                    next_tok = logits.argmax(-1)
            self._stream.synchronize()
            entry = _Graph(graph, inputs, logits, next_tok)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            torch.cuda.synchronize(self.device)
            if "out of memory" in str(exc).lower():
                raise
            self.warnings.append(f"CUDA graph capture failed for batch={key[0]} width={key[1]} "
                                 f"blocks, running eagerly: {exc!r}")
            entry = None
        self._graphs[key] = entry
        return entry

    @property
    def last_gpu_ms(self) -> float:
        """CUDA-event time of the last step, input copy to output copy, ms; NaN on the CPU."""
        if not self.is_cuda:
            return float("nan")
        return self._ev_start.elapsed_time(self._ev_end)

    @property
    def graph_shapes(self) -> list[tuple[int, int]]:
        """(padded batch, width in blocks) of the decode shapes replayed as CUDA graphs."""
        return [k for k, g in self._graphs.items() if g is not None]

    # -- swapping -------------------------------------------------------------------
    def swap_out(self, block_ids: Sequence[int]) -> SwapHandle:
        """Copy these blocks (all layers, K and V) to host memory; returns when done."""
        ids = torch.as_tensor(np.asarray(block_ids, np.int64))
        c = self.cfg
        host = torch.empty((c.layers, 2, ids.numel(), self.block_size, c.kv_heads, c.head_dim),
                           dtype=self.dtype, pin_memory=self._pin)
        if not self.is_cuda:
            host.copy_(self.kv[:, :, ids])
            return SwapHandle(host)
        with torch.cuda.stream(self._stream):
            host.copy_(self.kv[:, :, ids.to(self.device, non_blocking=True)], non_blocking=True)
        self._stream.synchronize()
        return SwapHandle(host)

    def swap_in(self, handle: SwapHandle, block_ids: Sequence[int]) -> None:
        """Copy swapped-out blocks back into these blocks (as many as the handle holds)."""
        ids = np.asarray(block_ids, np.int64)
        if ids.size != handle.num_blocks:
            raise ValueError(f"swap_in: {ids.size} block ids for a handle of {handle.num_blocks} blocks")
        if not self.is_cuda:
            self.kv[:, :, torch.as_tensor(ids)] = handle.data
            return
        with torch.cuda.stream(self._stream):
            dev = handle.data.to(self.device, non_blocking=True)
            self.kv[:, :, torch.as_tensor(ids).to(self.device, non_blocking=True)] = dev
        self._stream.synchronize()

    def describe(self) -> dict:
        """Settings for a profile's sidecar."""
        return {"torch": torch.__version__, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "cuda_graphs": self.cuda_graphs,
                "num_blocks": self.num_blocks, "block_size": self.block_size,
                "max_context": self.max_context, "sdpa_enable_gqa": _HAS_GQA,
                "sdpa_backends": "eager steps: flash, memory-efficient, math (no cuDNN: a plan per new shape); decode graphs: any",
                "prefill_with_context": ("flash attention, lower-right causal, grouped-query"
                                         if self._gqa_lower_right else
                                         "K/V heads repeated, lower-right causal SDPA"),
                "graph_batch_sizes": list(self.graph_batch_sizes),
                "decode_split_ctas": self.decode_split_ctas, "min_split_blocks": self.min_split_blocks,
                "kv_heads": self.cfg.kv_heads}


def draft_engine(target: PagedLLMEngine, seed: int | None = None) -> PagedLLMEngine:
    """The draft model's engine for speculative decoding beside ``target`` (not entered):
    :data:`~schedsim.live.engines.decoder.DRAFT_MODELS`' model for the target's, on the same
    device and dtype, with a pool of as many blocks of the same size (it reads and writes
    the target's block ids in its own pool) and the same context reach. Weights are seeded
    apart from the target's (``seed``: the target's plus one)."""
    from schedsim.live.engines.decoder import DRAFT_MODELS

    if target.name not in DRAFT_MODELS:
        raise ValueError(f"no draft model for {target.name!r}; drafts exist for {sorted(DRAFT_MODELS)}")
    return PagedLLMEngine(DRAFT_MODELS[target.name], target.num_blocks, target.block_size, target.device,
                          target.dtype, target.cuda_graphs, (target.seed + 1) if seed is None else seed,
                          max_context=target.max_context, graph_batch_sizes=target.graph_batch_sizes,
                          decode_split_ctas=target.decode_split_ctas, min_split_blocks=target.min_split_blocks)


def _lower_right(q_len: int, kv_len: int, device):
    """Causal mask for queries that are the last ``q_len`` of ``kv_len`` positions."""
    try:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(q_len, kv_len)
    except ImportError:  # torch < 2.3: a materialized boolean mask
        return (torch.arange(kv_len, device=device)[None, :]
                <= (kv_len - q_len + torch.arange(q_len, device=device))[:, None])


def _flash_gqa_lower_right(cfg: DecoderConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a lower-right causal SDPA with fewer K/V heads runs on flash attention here.

    ``CausalBias`` falls back to a materialized mask and the math kernel when flash cannot
    take the call, which at long contexts needs tens of GB; then the engine repeats the
    K/V heads instead, which the fused kernels do take.
    """
    if device.type != "cuda" or not _HAS_GQA or cfg.heads == cfg.kv_heads:
        return False
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        q = torch.empty(1, cfg.heads, 4, cfg.head_dim, device=device, dtype=dtype)
        k = torch.empty(1, cfg.kv_heads, 8, cfg.head_dim, device=device, dtype=dtype)
        return bool(can_use_flash_attention(SDPAParams(q, k, k, None, 0.0, True, True)))
    except Exception:  # noqa: BLE001 - older torch: no such check, take the safe path
        return False


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """The decoder's RMSNorm (float32 statistics), fused into one call where torch has one."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
    return norm(x)

