"""A builtin BERT-base-like encoder in PyTorch, and a runner that serves batches of it.

The encoder has random weights drawn from a seeded ``torch.Generator``: the cost of a
batch depends on the shapes, not on what the weights learned, so no checkpoint is
needed to measure it. The weights are drawn on the CPU in float32 and then moved, so a
seed gives the same weights on every device.

:class:`TorchEncoderRunner` does, per batch, what a serving loop does: copy the batch's
input ids from a pinned host buffer to a static device buffer, replay the CUDA graph
captured for that (batch, seq_len) shape (or run eagerly), copy the pooled output back
to a pinned host buffer and synchronize. It owns its buffers, its stream and its graphs
(Polygraphy's runner pattern), and also runs on the CPU, eagerly, for tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class EncoderConfig:
    """Shape of a BERT-like encoder."""

    layers: int
    """Number of transformer layers."""
    hidden: int
    """Hidden size (model width)."""
    heads: int
    """Attention heads; ``hidden`` must be divisible by it."""
    ffn: int
    """Inner size of the feed-forward block."""
    vocab: int = 30522
    """Vocabulary size (BERT's WordPiece vocabulary)."""
    max_positions: int = 512
    """Longest sequence the position embeddings cover."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon, as in BERT."""


CONFIGS: dict[str, EncoderConfig] = {
    "bert-base": EncoderConfig(layers=12, hidden=768, heads=12, ffn=3072),
    "bert-tiny": EncoderConfig(layers=2, hidden=128, heads=2, ffn=512),
}

DESCRIPTIONS: dict[str, str] = {
    name: (f"{name} ({c.layers} layers, hidden {c.hidden}, {c.heads} heads, "
           f"FFN {c.ffn}, random weights)")
    for name, c in CONFIGS.items()
}


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer layer as in BERT: attention, then GELU feed-forward."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        # [b, s, 3, heads, head_dim] -> 3 x [b, heads, s, head_dim]
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        # No mask: every position holds a real token (fixed-length batches).
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.attn_out(a))
        return self.ln2(x + self.ffn_out(F.gelu(self.ffn_in(x))))


class Encoder(nn.Module):
    """Embeddings, ``layers`` encoder layers and BERT's tanh pooler; returns [batch, hidden]."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.out_features = cfg.hidden
        self.word = nn.Embedding(cfg.vocab, cfg.hidden)
        self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type = nn.Embedding(2, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden)
        self.register_buffer("position_ids", torch.arange(cfg.max_positions), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = (self.word(input_ids) + self.position(self.position_ids[:s])
             + self.token_type.weight[0])
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


def _init_weights(model: Encoder, seed: int) -> None:
    """BERT's initialisation (normal(0, 0.02), zero biases, unit LayerNorm) from one generator."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02, generator=g)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        model.position_ids.copy_(torch.arange(model.cfg.max_positions))


def build_encoder(name: str, device="cpu", dtype=torch.float32, *, seed: int = 0) -> Encoder:
    """Build the named encoder ("bert-base" or "bert-tiny") with seeded random weights.

    The model is in eval mode with ``requires_grad`` off, so no autograd state is kept.
    """
    if name not in CONFIGS:
        raise ValueError(f"encoder name {name!r} is not known; valid names: {sorted(CONFIGS)}")
    # Built on the meta device so construction draws nothing from torch's global RNG.
    with torch.device("meta"):
        model = Encoder(CONFIGS[name])
    model.to_empty(device="cpu")
    _init_weights(model, seed)
    model.requires_grad_(False)
    return model.to(device=device, dtype=dtype).eval()


@dataclass
class _Shape:
    """Static buffers and (optionally) the captured graph for one (batch, seq_len)."""

    dev_in: torch.Tensor
    host_in: torch.Tensor
    host_in_np: np.ndarray
    out: torch.Tensor | None
    host_out: torch.Tensor
    host_out_np: np.ndarray
    graph: object | None


class TorchEncoderRunner:
    """Serve batches of an encoder with static buffers and one CUDA graph per shape.

    Use as a context manager; buffers, stream and graphs are made on entry and dropped
    on exit. Inputs are int64 token ids of shape [batch, seq_len]; the output is the
    pooled [batch, hidden] tensor in the model's dtype, returned as a numpy view of the
    runner's pinned host buffer (valid until the next :meth:`infer`).

    Hooks for callers: :meth:`host_input` gives the pinned staging array for a shape, so
    a serving loop can assemble a batch in place; after each :meth:`infer`,
    ``last_issue_ns`` / ``last_done_ns`` hold ``time.perf_counter_ns`` just before the
    input copy is issued and just after the synchronize returns, and ``last_gpu_ms`` the
    CUDA-event time of the graph replay (when ``record_gpu_time``).
    """

    def __init__(self, model: Encoder, *, max_batch: int, max_seq_len: int,
                 cuda_graphs: bool = True, record_gpu_time: bool = False,
                 compile: bool = False):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        if not 1 <= max_seq_len <= model.cfg.max_positions:
            raise ValueError(f"max_seq_len={max_seq_len} must be in 1..{model.cfg.max_positions}")
        self.model = model
        # Any module with .cfg.vocab/.cfg.max_positions works: the decoder sets
        # out_features to its vocabulary (last-position logits), encoders pool to hidden.
        self.out_features = getattr(model, "out_features", model.cfg.hidden)
        self.compile = compile
        # One compiled graph per shape (dynamic=False): what a shape-bucketed server does.
        self._forward = torch.compile(model, dynamic=False) if compile else model
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.is_cuda = self.device.type == "cuda"
        self.cuda_graphs = cuda_graphs and self.is_cuda
        self.record_gpu_time = record_gpu_time and self.is_cuda
        self.warnings: list[str] = []
        """Messages about shapes that fell back to eager (capture failed)."""
        self.last_issue_ns = 0
        self.last_done_ns = 0
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._open = False

    # -- lifetime -------------------------------------------------------------------
    def __enter__(self) -> "TorchEncoderRunner":
        n_in = self.max_batch * self.max_seq_len
        n_out = self.max_batch * self.out_features
        pin = self.is_cuda  # pinning needs a CUDA runtime; on the CPU it means nothing
        self._dev_in = torch.zeros(n_in, dtype=torch.int64, device=self.device)
        self._host_in = torch.zeros(n_in, dtype=torch.int64, pin_memory=pin)
        self._host_out = torch.zeros(n_out, dtype=self.dtype, pin_memory=pin)
        if self.is_cuda:
            self._stream = torch.cuda.Stream(device=self.device)
            self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
            self._ev_start = torch.cuda.Event(enable_timing=True)
            self._ev_end = torch.cuda.Event(enable_timing=True)
        self._open = True
        return self

    def __exit__(self, *exc) -> None:
        if self.is_cuda:
            self._stream.synchronize()
        self._shapes.clear()
        self._dev_in = self._host_in = self._host_out = None
        self._stream = self._pool = self._ev_start = self._ev_end = None
        self._open = False

    # -- shapes ---------------------------------------------------------------------
    def _shape(self, batch: int, seq_len: int) -> _Shape:
        key = (batch, seq_len)
        entry = self._shapes.get(key)
        if entry is None:
            entry = self.prepare(batch, seq_len)
        return entry

    def prepare(self, batch: int, seq_len: int) -> _Shape:
        """Make the buffers for a shape and, with CUDA graphs, warm up and capture it."""
        if not self._open:
            raise RuntimeError("TorchEncoderRunner used outside its `with` block")
        if not (1 <= batch <= self.max_batch and 1 <= seq_len <= self.max_seq_len):
            raise ValueError(f"shape (batch={batch}, seq_len={seq_len}) outside "
                             f"1..{self.max_batch} x 1..{self.max_seq_len}")
        n_in, n_out = batch * seq_len, batch * self.out_features
        # Leading slices of flat buffers, so every shape's views are contiguous.
        dev_in = self._dev_in[:n_in].view(batch, seq_len)
        host_in = self._host_in[:n_in].view(batch, seq_len)
        host_out = self._host_out[:n_out].view(batch, self.out_features)
        entry = _Shape(dev_in, host_in, host_in.numpy(), None, host_out, host_out.numpy(), None)
        if self.cuda_graphs:
            entry.graph, entry.out = self._capture(dev_in, batch, seq_len)
        self._shapes[(batch, seq_len)] = entry
        return entry

    def _capture(self, dev_in: torch.Tensor, batch: int, seq_len: int):
        torch.cuda.synchronize(self.device)
        try:
            with torch.no_grad():
                with torch.cuda.stream(self._stream):
                    self._forward(dev_in)  # warm-up launch: kernel selection, workspaces
                    if self.compile:
                        self._forward(dev_in)  # compiled code may pick kernels on call two
                self._stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                    out = self._forward(dev_in)
            self._stream.synchronize()
            return graph, out
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            torch.cuda.synchronize(self.device)
            self.warnings.append(f"CUDA graph capture failed for batch={batch} "
                                 f"seq_len={seq_len}, running eagerly: {exc!r}")
            return None, None

    def host_input(self, batch: int, seq_len: int) -> np.ndarray:
        """The pinned staging array [batch, seq_len] (int64) that :meth:`infer` copies from."""
        return self._shape(batch, seq_len).host_in_np

    # -- the per-batch work ---------------------------------------------------------
    def infer(self, batch: int, seq_len: int, input_ids_host=None) -> np.ndarray:
        """Run one batch: H2D copy of ids, graph replay (or eager), D2H copy, synchronize.

        ``input_ids_host`` is a [batch, seq_len] integer array or CPU tensor; it is first
        copied into the pinned staging buffer unless it already is that buffer. ``None``
        means the ids are already in :meth:`host_input`.
        """
        e = self._shape(batch, seq_len)
        if input_ids_host is not None and input_ids_host is not e.host_in_np:
            if isinstance(input_ids_host, torch.Tensor):
                e.host_in.copy_(input_ids_host)
            else:
                np.copyto(e.host_in_np, input_ids_host, casting="same_kind")
        self.last_issue_ns = time.perf_counter_ns()
        if not self.is_cuda:
            e.dev_in.copy_(e.host_in)
            with torch.no_grad():
                e.host_out.copy_(self._forward(e.dev_in))
            self.last_done_ns = time.perf_counter_ns()
            return e.host_out_np
        with torch.cuda.stream(self._stream):
            e.dev_in.copy_(e.host_in, non_blocking=True)
            if self.record_gpu_time:
                self._ev_start.record(self._stream)
            if e.graph is not None:
                e.graph.replay()
                out = e.out
            else:
                with torch.no_grad():
                    out = self._forward(e.dev_in)
            if self.record_gpu_time:
                self._ev_end.record(self._stream)
            e.host_out.copy_(out, non_blocking=True)
        self._stream.synchronize()
        self.last_done_ns = time.perf_counter_ns()
        return e.host_out_np

    @property
    def last_gpu_ms(self) -> float:
        """CUDA-event time of the last replay (or eager forward), in ms; NaN if not recorded."""
        if not self.record_gpu_time:
            return float("nan")
        return self._ev_start.elapsed_time(self._ev_end)

    def describe(self) -> dict:
        """Settings for a profile's sidecar."""
        return {"torch": torch.__version__, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "cuda_graphs": self.cuda_graphs,
                "compile": self.compile,
                "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32)}

    @property
    def graph_shapes(self) -> list[tuple[int, int]]:
        """Shapes that run as a captured CUDA graph."""
        return [k for k, e in self._shapes.items() if e.graph is not None]
