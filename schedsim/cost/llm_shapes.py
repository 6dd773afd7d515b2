"""How the LLM engine pads a step, shared by the engine and the step cost model.

A decode-only step runs through a CUDA graph captured for a fixed number of sequences
and a fixed key/value width, so it costs what its *padded* shape costs: the batch is
rounded up to the next captured size and every sequence's context up to the next
power-of-two number of blocks above the longest one. Mixed steps (any prefill) run
eagerly and pad nothing but the gathered context of their decodes to the longest one.
Both sides import these functions, so a change to the engine's padding changes the
model's features with it.

Pure Python and numpy: the simulator imports this without torch.
"""

from __future__ import annotations

import numpy as np

CUDA_GRAPH_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Decode batch sizes the engine captures graphs for (vLLM captures a similar ladder)."""

MIN_GRAPH_CONTEXT_BLOCKS = 16
"""Smallest key/value width of a captured decode graph, in blocks."""


def graph_batch(n: int, sizes: tuple[int, ...] = CUDA_GRAPH_BATCH_SIZES) -> int:
    """The captured batch size a decode step of ``n`` sequences runs at (0: beyond the largest)."""
    for size in sizes:
        if size >= n:
            return size
    return 0


def graph_batch_array(n: np.ndarray, sizes: tuple[int, ...] = CUDA_GRAPH_BATCH_SIZES) -> np.ndarray:
    """:func:`graph_batch` for an array of sequence counts (0 where beyond the largest)."""
    table = np.asarray(sizes, dtype=np.int64)
    idx = np.searchsorted(table, n, side="left")
    return np.where(idx < table.size, table[np.minimum(idx, table.size - 1)], 0)


def context_blocks(max_context: int, block_size: int) -> int:
    """Blocks of the key/value width a decode graph gathers for contexts up to ``max_context``."""
    blocks = max(-(-int(max_context) // block_size), 1)
    return max(MIN_GRAPH_CONTEXT_BLOCKS, 1 << (blocks - 1).bit_length())


def context_blocks_array(max_context: np.ndarray, block_size: int) -> np.ndarray:
    """:func:`context_blocks` for an array of longest contexts."""
    blocks = np.maximum(-(-np.asarray(max_context, dtype=np.int64) // block_size), 1)
    # 1 << bit_length(blocks - 1), the next power of two >= blocks: frexp's exponent is the
    # bit length, exactly, for integers below 2**53.
    pow2 = np.left_shift(np.int64(1), np.frexp(blocks - 1)[1].astype(np.int64))
    return np.maximum(pow2, MIN_GRAPH_CONTEXT_BLOCKS)
