"""An engine whose steps take no time, for measuring and testing the live loop alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class _Cfg:
    vocab: int = 32000


class NullLLMEngine:
    """An engine with :class:`~schedsim.live.engines.llm_engine.PagedLLMEngine`'s interface
    whose steps take no time: every row's next token is 1, no GPU, no memory."""

    cuda_graphs = False
    graph_batch_sizes = ()
    last_gpu_ms = 0.0
    last_graph = False

    def __init__(self, num_blocks: int, block_size: int, max_context: int):
        self.num_blocks, self.block_size, self.max_context = int(num_blocks), int(block_size), int(max_context)
        self.cfg = _Cfg()
        self.warnings: list[str] = []

    def execute(self, rows) -> np.ndarray:
        return np.ones(len(rows), np.int64)

    def swap_out(self, blocks):
        return _Handle(len(blocks))

    def swap_in(self, handle, blocks) -> None:
        pass


@dataclass(frozen=True)
class _Handle:
    num_blocks: int
