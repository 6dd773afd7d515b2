"""A policy's KV budget: model spec + memory flags -> GPU blocks, swap blocks, max length.

One function so that ``paged-kv``, ``continuous`` and LLM ``static`` given the same flags
manage the same memory (what a comparison of their concurrency at equal memory rests on).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedsim.cost.llm_spec import ModelSpec, gpu_blocks, load_model_spec
from schedsim.errors import InputError

DEFAULT_GPU_MEMORY_GB = 141.0
"""An H200's memory, the device of the bundled decoder profile."""


@dataclass(frozen=True)
class KVBudget:
    spec: object
    """The :class:`~schedsim.cost.llm_spec.ModelSpec`."""
    block_size: int
    num_blocks: int
    """GPU blocks, including vLLM's reserved null block."""
    num_swap_blocks: int
    """Host blocks for swap preemption (0 unless preemption_mode=swap)."""
    max_model_len: int
    detail: object
    """The spec module's block budget (weights, activations, how it was derived)."""

    @property
    def tokens(self) -> int:
        """KV tokens the GPU holds (the null block excluded)."""
        return (self.num_blocks - 1) * self.block_size

    def describe(self) -> dict:
        d = getattr(self.detail, "__dict__", {})
        return {"model_spec": self.spec.name, "block_size": self.block_size,
                "num_gpu_blocks": self.num_blocks, "num_swap_blocks": self.num_swap_blocks,
                "kv_tokens": self.tokens, "max_model_len": self.max_model_len,
                "kv_bytes_per_token": self.spec.kv_bytes_per_token,
                **{k: v for k, v in d.items() if isinstance(v, (int, float, str))}}


def kv_budget(model_spec, *, block_size: int = 16, num_gpu_blocks: int | None = None,
              gpu_memory_gb: float | None = None, gpu_memory_utilization: float = 0.9,
              max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
              max_model_len: int | None = None, swap_space_gb: float = 0.0) -> KVBudget:
    if int(block_size) < 1:
        raise InputError(f"--block-size: {block_size} is not valid; expected an integer >= 1")
    if num_gpu_blocks is not None and gpu_memory_gb is not None:
        raise InputError("--num-gpu-blocks and --gpu-memory-gb: give one, not both")
    if swap_space_gb < 0:
        raise InputError(f"--swap-space-gb: {swap_space_gb} is not valid; expected >= 0")
    spec = model_spec if isinstance(model_spec, ModelSpec) else load_model_spec(model_spec)
    if num_gpu_blocks is None and gpu_memory_gb is None:
        gpu_memory_gb = DEFAULT_GPU_MEMORY_GB
    detail = gpu_blocks(spec, block_size=int(block_size), gpu_memory_gb=gpu_memory_gb,
                        gpu_memory_utilization=gpu_memory_utilization, num_gpu_blocks=num_gpu_blocks,
                        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    blocks = int(detail.num_blocks)
    if blocks < 2:
        raise InputError(f"--num-gpu-blocks: {blocks} blocks leave no KV cache (one block is reserved); "
                         f"expected >= 2")
    length = int(max_model_len or spec.max_model_len)
    if length < 2:
        raise InputError(f"--max-model-len: {max_model_len} is not valid; expected >= 2")
    # vLLM reads swap_space in GiB.
    swap = int(swap_space_gb * 2**30 // (int(block_size) * spec.kv_bytes_per_token))
    return KVBudget(spec, int(block_size), blocks, swap, length, detail)
