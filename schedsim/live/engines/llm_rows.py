"""What a step hands the paged LLM engine, row by row: importable without torch, so the
live loop (schedsim.live.llm_driver) also runs against engines that need no torch (the loop
overhead's null engine, tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

NULL_BLOCK = 0
"""The reserved block that padding reads and writes; a KV manager never hands it out."""


@dataclass(frozen=True)
class EngineRow:
    """One request's share of a step."""

    tokens: np.ndarray | Sequence[int]
    """Token ids computed this step: a prefill chunk, or the one last token when decoding."""
    context: int
    """Tokens of this request already in the KV cache; the first new token sits at this position."""
    block_table: np.ndarray | Sequence[int]
    """Block ids holding the request's tokens in order (block i holds positions
    i * block_size ...); it must cover ``context + len(tokens)`` positions."""
