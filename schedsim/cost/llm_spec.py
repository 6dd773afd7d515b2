"""Model specs (shapes, KV bytes per token, weight bytes) and the GPU's KV block budget.

A paged-KV engine holds every sequence's keys and values in fixed blocks of
``block_size`` tokens. How many blocks fit on the GPU follows vLLM's rule
(``vllm/v1/worker/gpu_worker.py``: ``determine_available_memory``, and
``vllm/v1/core/kv_cache_utils.py``)::

    num_blocks = floor((gpu_memory * gpu_memory_utilization - weights - activation peak)
                       / (block_size * kv_bytes_per_token))

unless ``num_gpu_blocks`` is given, which overrides it as vLLM's
``num_gpu_blocks_override`` does. vLLM measures the activation peak with a profiling
forward pass; :func:`activation_bytes` estimates it with a stated model instead.

Built-in specs carry the published shapes of their Hugging Face ``config.json``;
:func:`load_model_spec` also reads a JSON file with this module's field names or a
Hugging Face ``config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from schedsim.errors import InputError, where

GIB = 1 << 30
"""Bytes in a GiB: ``gpu_memory_gb`` counts these, as nvidia-smi and vLLM's logs do (an "80 GB" A100 has 80 GiB)."""

DEFAULT_MODEL = "llama-1b"


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as serving memory and KV traffic need it."""

    name: str
    """Short name used in messages and results."""
    layers: int
    """Transformer layers."""
    hidden: int
    """Model width."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention); ``heads`` must be divisible by it; equal for MHA."""
    head_dim: int
    """Width of one attention head."""
    ffn: int
    """Inner size of the feed-forward block."""
    vocab: int
    """Vocabulary size."""
    dtype_bytes: int = 2
    """Bytes per weight and per KV element: 2 for fp16/bf16, 4 for fp32, 1 for fp8."""
    max_model_len: int = 8192
    """Longest sequence (prompt plus output tokens) the model serves; longer requests are refused."""
    tied_embeddings: bool = False
    """The output projection reuses the input embedding (one vocab x hidden matrix, not two)."""
    gated_ffn: bool = True
    """The feed-forward block has three matrices (SwiGLU: gate, up, down); False for two (OPT's ReLU MLP)."""
    weight_bytes: int | None = None
    """Bytes of the weights on the GPU; None computes them from the shapes (:meth:`computed_weight_bytes`)."""
    description: str = ""
    """One line: where the shapes come from."""

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype_bytes",
                  "max_model_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"model spec {self.name}: {f}: {v!r} must be an integer >= 1")
        if self.heads % self.kv_heads:
            raise InputError(f"model spec {self.name}: kv_heads: {self.kv_heads} must divide heads ({self.heads})")
        if self.weight_bytes is None:
            object.__setattr__(self, "weight_bytes", self.computed_weight_bytes())
        elif isinstance(self.weight_bytes, bool) or not isinstance(self.weight_bytes, int) or self.weight_bytes < 0:
            raise InputError(f"model spec {self.name}: weight_bytes: {self.weight_bytes!r} must be an integer >= 0")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token holds in the cache: 2 x layers x kv_heads x head_dim x dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def parameter_count(self) -> int:
        """Parameters of the matrices and norms (biases and learned position tables omitted: < 0.1%)."""
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2       # q, o; k, v
        mlp = (3 if self.gated_ffn else 2) * h * self.ffn
        per_layer = attn + mlp + 2 * h                                 # two norms
        embed = self.vocab * h * (1 if self.tied_embeddings else 2)
        return embed + self.layers * per_layer + h                     # final norm

    def computed_weight_bytes(self) -> int:
        """:meth:`parameter_count` x ``dtype_bytes``."""
        return self.parameter_count() * self.dtype_bytes


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, max_len, tied, desc, head_dim=None):
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim or hidden // heads, ffn=ffn, vocab=vocab, dtype_bytes=2,
                     max_model_len=max_len, tied_embeddings=tied, description=desc)


MODEL_SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    _llama("llama-1b", 16, 2048, 32, 8, 8192, 128256, 262144, True,
           "schedsim's measured random-weight decoder (schedsim.live.engines.decoder 'llama-1b'): Llama 3.2 1B "
           "shapes, bf16; max_model_len 262144 because random weights have no trained length limit, "
           "so Mooncake's ~190k-token prompts fit"),
    _llama("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, True,
           "meta-llama/Llama-3.2-1B config.json, bf16"),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, False,
           "meta-llama/Meta-Llama-3-8B config.json, bf16"),
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, False,
           "meta-llama/Llama-3.1-8B config.json, bf16"),
    _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072, False,
           "meta-llama/Llama-3.1-70B config.json, bf16 (one GPU's share needs tensor parallelism: "
           "this spec is the whole model)"),
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, False,
           "mistralai/Mistral-7B-v0.1 config.json, bf16 (its 4096-token sliding window is not modelled: "
           "KV is kept for the whole context)"),
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, False,
           "Qwen/Qwen2.5-7B-Instruct config.json, bf16 (QKV biases omitted from the weight count)"),
    ModelSpec(name="opt-13b", layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128, ffn=20480,
              vocab=50272, dtype_bytes=2, max_model_len=2048, tied_embeddings=True, gated_ffn=False,
              description="facebook/opt-13b config.json, fp16: the vLLM paper's (SOSP'23) model; MHA, ReLU MLP"),
)}
"""Built-in specs by name; ``llama-1b`` is the default."""


# ----------------------------------------------------------------------------- loading

_HF_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float": 4, "half": 2,
              "float8_e4m3fn": 1, "float8_e5m2": 1}


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A built-in spec by name, or a JSON file: this module's field names or a Hugging Face ``config.json``.

    A Hugging Face config is recognised by ``num_hidden_layers``; it maps
    ``num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads`` (default:
    the attention heads), ``head_dim`` (default hidden / heads), ``intermediate_size`` (or
    OPT's ``ffn_dim``, then a two-matrix MLP), ``vocab_size``, ``max_position_embeddings``,
    ``torch_dtype`` (or ``dtype``; default bf16) and ``tie_word_embeddings`` (default
    false, as Llama's). Other keys are ignored. A file with our field names must not have
    unknown keys (typos would otherwise pass silently).
    """
    if name_or_path in MODEL_SPECS:
        return MODEL_SPECS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(f"model spec {name_or_path!r}: not a built-in ({', '.join(MODEL_SPECS)}) "
                         f"and no such JSON file")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read model spec: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{where(path, e.lineno)}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a model spec must be a JSON object, got {type(raw).__name__}")
    kw = _from_hf(raw, path) if "num_hidden_layers" in raw else _from_ours(raw, path)
    try:
        return ModelSpec(**kw)
    except InputError as e:  # name the file rather than the spec
        msg, prefix = str(e), f"model spec {kw['name']}: "
        raise InputError(f"{path}: {msg.removeprefix(prefix)}") from None


def _int(raw: dict, key: str, path: Path, default=None) -> int:
    if key not in raw or raw[key] is None:
        if default is None:
            raise InputError(f"{where(path, None, key)}: missing (needed for a model spec)")
        return default
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{where(path, None, key)}: {v!r} must be an integer >= 1")
    return v


def _bool(raw: dict, key: str, path: Path, default: bool) -> bool:
    v = raw.get(key, default)
    if not isinstance(v, bool):
        raise InputError(f"{where(path, None, key)}: {v!r} must be true or false")
    return v


def _from_hf(raw: dict, path: Path) -> dict:
    heads = _int(raw, "num_attention_heads", path)
    hidden = _int(raw, "hidden_size", path)
    gated = "ffn_dim" not in raw
    dtype_key = "torch_dtype" if "torch_dtype" in raw else "dtype"
    dtype = raw.get(dtype_key, "bfloat16")
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in _HF_DTYPES:
        raise InputError(f"{where(path, None, dtype_key)}: {dtype!r} is not one of {', '.join(_HF_DTYPES)}")
    name = raw.get("_name_or_path") or path.stem
    if path.name == "config.json" and not raw.get("_name_or_path"):
        name = path.parent.name or path.stem
    return dict(
        name=str(name), layers=_int(raw, "num_hidden_layers", path), hidden=hidden, heads=heads,
        kv_heads=_int(raw, "num_key_value_heads", path, default=heads),
        head_dim=_int(raw, "head_dim", path, default=max(hidden // heads, 1)),
        ffn=_int(raw, "intermediate_size" if gated else "ffn_dim", path),
        vocab=_int(raw, "vocab_size", path),
        dtype_bytes=_HF_DTYPES[dtype.removeprefix("torch.")],
        max_model_len=_int(raw, "max_position_embeddings", path),
        tied_embeddings=_bool(raw, "tie_word_embeddings", path, False),
        gated_ffn=gated,
        description=f"Hugging Face config {path}",
    )


def _from_ours(raw: dict, path: Path) -> dict:
    known = {f.name for f in fields(ModelSpec)}
    for key in raw:
        if key not in known:
            raise InputError(f"{where(path, None, key)}: unknown field (a model spec has {', '.join(sorted(known))}; "
                             f"or give a Hugging Face config.json)")
    kw = {"name": str(raw.get("name") or path.stem), "description": str(raw.get("description", f"model spec {path}"))}
    for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
        kw[key] = _int(raw, key, path)
    for key, default in (("dtype_bytes", 2), ("max_model_len", 8192)):
        kw[key] = _int(raw, key, path, default=default)
    for key, default in (("tied_embeddings", False), ("gated_ffn", True)):
        kw[key] = _bool(raw, key, path, default)
    if raw.get("weight_bytes") is not None:
        v = raw["weight_bytes"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{where(path, None, 'weight_bytes')}: {v!r} must be an integer >= 0 (bytes)")
        kw["weight_bytes"] = v
    return kw


# ----------------------------------------------------------------------------- block budget

@dataclass(frozen=True)
class BlockBudget:
    """How many KV blocks a GPU holds for a model, and where its memory went."""

    num_blocks: int
    """KV blocks of ``block_size`` tokens (vLLM's ``num_gpu_blocks``; vLLM v1 keeps one as its null block)."""
    block_size: int
    """Tokens per block."""
    bytes_per_block: int
    """block_size x kv_bytes_per_token."""
    weights_bytes: int
    """Model weights."""
    activation_bytes: int
    """Estimated activation peak of one forward pass (:func:`activation_bytes`)."""
    kv_bytes: int
    """num_blocks x bytes_per_block."""
    how: str
    """'derived' from GPU memory, or 'given' (num_gpu_blocks)."""

    @property
    def kv_tokens_capacity(self) -> int:
        """Tokens the KV cache holds: num_blocks x block_size (vLLM logs it as "GPU KV cache size")."""
        return self.num_blocks * self.block_size


def activation_bytes(spec: ModelSpec, *, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> int:
    """Estimated activation peak of the largest forward pass, bytes.

    Layers run one after another and free their intermediates, so the peak is one layer's
    live tensors at the feed-forward block, for ``max_num_batched_tokens`` tokens: the
    residual stream and its normalised copy (2 x hidden), the fused gate/up output
    (2 x ffn; 1 x ffn for a two-matrix MLP) and the activated product (ffn), in the
    model's dtype; plus the sampler's float32 logits and probabilities for ``max_num_seqs``
    sequences (2 x vocab x 4 bytes each)::

        T x (2 hidden + 3 ffn) x dtype_bytes + 2 x S x vocab x 4

    Not included: the CUDA context, NCCL buffers and CUDA-graph pools, which vLLM also
    leaves outside its profiled peak or accounts for separately.
    """
    mlp = (3 if spec.gated_ffn else 2) * spec.ffn
    return (max_num_batched_tokens * (2 * spec.hidden + mlp) * spec.dtype_bytes
            + 2 * max_num_seqs * spec.vocab * 4)


def gpu_blocks(spec: ModelSpec, *, block_size: int, gpu_memory_gb: float | None = None,
               gpu_memory_utilization: float = 0.9, num_gpu_blocks: int | None = None,
               max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> BlockBudget:
    """The KV block budget: ``num_gpu_blocks`` when given, else vLLM's rule (module docstring).

    ``gpu_memory_gb`` is in GiB (:data:`GIB`). Raises InputError, naming the flags, when
    neither is given or when weights and activations leave no room for a single block.
    """
    def check_int(name, v, lo):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(f"{name}: {v!r} must be an integer >= {lo}")
    check_int("block_size", block_size, 1)
    check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    check_int("max_num_seqs", max_num_seqs, 1)
    if not (isinstance(gpu_memory_utilization, (int, float)) and 0 < gpu_memory_utilization <= 1):
        raise InputError(f"gpu_memory_utilization: {gpu_memory_utilization!r} must be in (0, 1]")
    bytes_per_block = block_size * spec.kv_bytes_per_token
    act = activation_bytes(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    weights = int(spec.weight_bytes)
    if num_gpu_blocks is not None:
        check_int("num_gpu_blocks", num_gpu_blocks, 1)
        return BlockBudget(num_gpu_blocks, block_size, bytes_per_block, weights, act,
                           num_gpu_blocks * bytes_per_block, "given")
    if gpu_memory_gb is None:
        raise InputError("the KV cache needs a size: give gpu_memory_gb (--gpu-memory-gb) or "
                         "num_gpu_blocks (--num-gpu-blocks)")
    if not (isinstance(gpu_memory_gb, (int, float)) and not isinstance(gpu_memory_gb, bool)
            and math.isfinite(gpu_memory_gb) and gpu_memory_gb > 0):
        raise InputError(f"gpu_memory_gb: {gpu_memory_gb!r} must be a number > 0 (GiB)")
    usable = int(gpu_memory_gb * GIB * gpu_memory_utilization)
    free = usable - weights - act
    num = free // bytes_per_block if free > 0 else 0
    if num < 1:
        what = ("exceed" if free <= 0 else
                f"leave less than one {block_size}-token KV block ({bytes_per_block / 2**20:.2f} MiB) of")
        raise InputError(
            f"model spec {spec.name}: weights {weights / GIB:.2f} GiB + activations {act / GIB:.2f} GiB "
            f"{what} gpu_memory_gb*gpu_memory_utilization = {usable / GIB:.2f} GiB: no KV blocks; raise "
            f"--gpu-memory-gb or --gpu-memory-utilization, lower --max-num-batched-tokens, or give "
            f"--num-gpu-blocks")
    return BlockBudget(int(num), block_size, bytes_per_block, weights, act, int(num) * bytes_per_block, "derived")
