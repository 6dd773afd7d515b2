"""The step profiler's grid: the step compositions it measures.

A :class:`Composition` is one step's shape (prefill chunks and their cached context, decode
rows and their contexts); :func:`step_grid` lists the compositions the profiler measures,
decode-only, prefill-only and mixed. Why the grid holds these shapes:
:mod:`schedsim.profiling.step_profiler`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES

# The grid. Decode contexts sit just under a power-of-two width (or well inside one) and
# a few just above (3000, 6000) to show the padding; see :mod:`schedsim.profiling.step_profiler`.
DECODE_CONTEXTS = (16, 100, 250, 500, 1000, 2000, 3000, 4000, 6000, 8000, 16000, 32000,
                   64000, 128000, 196607)
DECODE_BETWEEN = (3, 20, 100, 200)
"""Decode batch sizes between graph sizes: they run padded to the next graph size."""
SPREAD_BATCHES = (4, 16, 32, 64, 128, 256)
"""Decode batch sizes measured with mixed contexts."""
SPREADS = ((100, 2000, 1), (100, 8000, 1), (100, 8000, 3), (1000, 32000, 1), (16, 128000, 3))
"""(shortest, longest, power): mixed decode contexts, shortest + (longest - shortest) x^power
for x evenly in [0, 1] (power 3: most rows short, a few long, as live batches often are)."""
MIXED_SPREAD_DECODES = (32, 128)
"""Decodes with mixed contexts beside one 512-token chunk (eager steps)."""
BETWEEN_CONTEXTS = (100, 1000, 4000)
PREFILL_CHUNKS = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_CONTEXTS = (0, 1000, 4000, 16000, 64000, 128000, 188416)
MULTI_PREFILL = ((2, 512, 0), (4, 512, 0), (2, 2048, 0), (2, 1024, 4000))
"""(prefill_seqs, chunk, context): several chunks in one step."""
MIXED_PREFILL = ((1, 128), (1, 512), (1, 2048), (2, 512))
MIXED_PREFILL_CONTEXTS = (0, 8000)
MIXED_DECODES = (8, 32, 128)
MIXED_DECODE_CONTEXTS = (1000, 8000)
KV_TOKEN_BUDGET = 1 << 21
"""Most tokens a measured step holds in the KV cache (2^21 = 64 GiB for llama-1b in bf16)."""


@dataclass(frozen=True, order=True)
class Composition:
    """The shape of one step; see :mod:`schedsim.profiling.step_profiler`."""

    prefill_seqs: int = 0
    prefill_chunk: int = 0
    prefill_context: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    """The longest decode row's context (every row's, unless ``decode_contexts`` says otherwise)."""
    decode_contexts: tuple[int, ...] = ()
    """Each decode row's context when they differ (mixed contexts), the longest
    ``decode_context``; () when every row has ``decode_context``."""

    def __post_init__(self):
        dc = self.decode_contexts
        if dc and (len(dc) != self.decode_seqs or max(dc) != self.decode_context or min(dc) < 0):
            raise ValueError(f"decode_contexts: {len(dc)} contexts up to {max(dc)} for decode_seqs="
                             f"{self.decode_seqs} up to decode_context={self.decode_context}")

    @classmethod
    def spread(cls, decodes: int, shortest: int, longest: int, power: float = 1,
               prefill: tuple[int, int, int] = (0, 0, 0)) -> "Composition":
        """``decodes`` rows with contexts ``shortest + (longest - shortest) x^power``, x evenly
        in [0, 1], beside ``prefill`` (seqs, chunk, context)."""
        x = np.linspace(0.0, 1.0, decodes) ** power
        contexts = tuple(int(c) for c in np.round(shortest + (longest - shortest) * x))
        return cls(*prefill, decodes, max(contexts), contexts)

    @property
    def row_contexts(self) -> tuple[int, ...]:
        """Each decode row's context."""
        return self.decode_contexts or (self.decode_context,) * self.decode_seqs

    @property
    def decode_kv_tokens(self) -> int:
        """KV tokens the decode rows attend over: the sum of their contexts + 1."""
        if self.decode_contexts:
            return sum(self.decode_contexts) + self.decode_seqs
        return self.decode_seqs * (self.decode_context + 1)

    @property
    def tokens(self) -> int:
        """Tokens the step computes (the M of its GEMMs)."""
        return self.prefill_seqs * self.prefill_chunk + self.decode_seqs

    @property
    def kind(self) -> str:
        if self.prefill_seqs and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_seqs else "decode"

    @property
    def longest(self) -> int:
        """Longest request in the step after it: context plus new tokens."""
        p = self.prefill_context + self.prefill_chunk if self.prefill_seqs else 0
        d = self.decode_context + 1 if self.decode_seqs else 0
        return max(p, d)

    @property
    def kv_tokens(self) -> int:
        return self.prefill_seqs * (self.prefill_context + self.prefill_chunk) + self.decode_kv_tokens

    def blocks(self, block_size: int, extra_chunk: int = 0) -> int:
        """KV blocks the step's rows hold (each row its own), with room for prefill chunks
        ``extra_chunk`` tokens longer (fresh-shape samples)."""
        prefill = self.prefill_context + self.prefill_chunk + extra_chunk
        return (self.prefill_seqs * -(-prefill // block_size)
                + sum(-(-(c + 1) // block_size) for c in self.row_contexts))

    @property
    def label(self) -> str:
        parts = []
        if self.prefill_seqs:
            parts.append(f"{self.prefill_seqs}x prefill {self.prefill_chunk}@{self.prefill_context}")
        if self.decode_contexts:
            parts.append(f"{self.decode_seqs}x decode @{min(self.decode_contexts)}.."
                         f"{self.decode_context} ({self.decode_kv_tokens} KV tokens)")
        elif self.decode_seqs:
            parts.append(f"{self.decode_seqs}x decode @{self.decode_context}")
        return " + ".join(parts)

    def key(self) -> tuple[int, ...]:
        return (self.prefill_seqs, self.prefill_chunk, self.prefill_context, self.decode_seqs,
                self.decode_context)


def step_grid(max_context: int, *, quick: bool = False,
              kv_token_budget: int = KV_TOKEN_BUDGET) -> list[Composition]:
    """The compositions to measure: decode-only, prefill-only, mixed (in that order)."""
    if quick:
        grid = ([Composition(decode_seqs=b, decode_context=c) for b in (1, 3, 8) for c in (16, 100)]
                + [Composition(1, q, c) for q in (16, 64) for c in (0, 60)]
                + [Composition(2, 32, 0), Composition(1, 32, 0, 4, 100),
                   Composition.spread(8, 16, 100), Composition.spread(4, 16, 100, 1, (1, 32, 0))])
    else:
        grid = [Composition(decode_seqs=b, decode_context=c)
                for b in CUDA_GRAPH_BATCH_SIZES for c in DECODE_CONTEXTS]
        grid += [Composition(decode_seqs=b, decode_context=c)
                 for b in DECODE_BETWEEN for c in BETWEEN_CONTEXTS]
        grid += [Composition(1, q, c) for q in PREFILL_CHUNKS for c in PREFILL_CONTEXTS]
        grid += [Composition(s, q, c) for s, q, c in MULTI_PREFILL]
        grid += [Composition(s, q, pc, b, dc) for s, q in MIXED_PREFILL
                 for pc in MIXED_PREFILL_CONTEXTS for b in MIXED_DECODES
                 for dc in MIXED_DECODE_CONTEXTS]
        grid += [Composition.spread(b, *spread) for b in SPREAD_BATCHES for spread in SPREADS]
        grid += [Composition.spread(b, *SPREADS[i], prefill=(1, 512, 0))
                 for b in MIXED_SPREAD_DECODES for i in (1, 2)]
    return [c for c in grid if c.longest <= max_context and c.kv_tokens <= kv_token_budget]
