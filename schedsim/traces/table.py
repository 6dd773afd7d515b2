"""Request traces: one columnar table of equal-length numpy arrays, rows sorted by arrival.

Loaders and importers live in :mod:`schedsim.traces.io`; synthetic generators in
:mod:`schedsim.traces.generate`. This module only defines the table and its invariants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests in arrival order. Row ``i`` is request ``i`` everywhere in schedsim."""

    arrival_s: np.ndarray
    """float64 seconds from the start of the trace, non-decreasing."""
    request_id: np.ndarray
    """int64 identifier from the file (row number when the file has none)."""
    batch: np.ndarray
    """int32 samples carried by the request (its first-dimension size), >= 1."""
    seq_len: np.ndarray
    """int32 sequence length of the request's variable-size input; 0 when not given."""
    input_tokens: np.ndarray
    """int32 prompt tokens (LLM traces); 0 when not given."""
    output_tokens: np.ndarray
    """int32 tokens to generate (LLM traces); 0 when not given."""
    priority: np.ndarray
    """int16 priority level, 1 is served first; 0 means the policy's default level."""
    timeout_us: np.ndarray
    """int64 per-request queue timeout in microseconds; 0 means none."""
    hash_offsets: np.ndarray | None = None
    """int64, length n+1: request i's prefix-block hashes are hash_ids[hash_offsets[i]:hash_offsets[i+1]]."""
    hash_ids: np.ndarray | None = None
    """int64 flattened prefix-block hash ids (Mooncake); None when the trace has none."""
    source: str = "<memory>"
    """Where the trace came from, for messages and provenance."""
    meta: dict = field(default_factory=dict)
    """Free-form provenance (generator parameters, importer name, ...)."""

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def has_seq_len(self) -> bool:
        return bool(len(self) and self.seq_len.any())

    @classmethod
    def from_arrivals(cls, arrival_s, *, batch=None, seq_len=None, input_tokens=None,
                      output_tokens=None, priority=None, timeout_us=None, request_id=None,
                      source: str = "<memory>", meta: dict | None = None) -> "Trace":
        """Build a trace from arrays; omitted columns take their defaults."""
        arrival_s = np.ascontiguousarray(arrival_s, dtype=np.float64)
        n = arrival_s.shape[0]

        def col(values, dtype, default):
            if values is None:
                # np.zeros leaves the pages untouched until used: a 2M-row trace without
                # token, priority or timeout columns costs no memory for them.
                return np.zeros(n, dtype=dtype) if default == 0 else np.full(n, default, dtype=dtype)
            arr = np.ascontiguousarray(values, dtype=dtype)
            if arr.shape != (n,):
                raise ValueError(f"column of shape {arr.shape}, expected ({n},)")
            return arr

        return cls(
            arrival_s=arrival_s,
            request_id=col(request_id, np.int64, 0) if request_id is not None else np.arange(n, dtype=np.int64),
            batch=col(batch, np.int32, 1),
            seq_len=col(seq_len, np.int32, 0),
            input_tokens=col(input_tokens, np.int32, 0),
            output_tokens=col(output_tokens, np.int32, 0),
            priority=col(priority, np.int16, 0),
            timeout_us=col(timeout_us, np.int64, 0),
            source=source,
            meta=dict(meta or {}),
        )

    def slice(self, start: int, stop: int) -> "Trace":
        """Rows [start, stop), arrival times unchanged."""
        hash_offsets = hash_ids = None
        if self.hash_offsets is not None:
            lo, hi = self.hash_offsets[start], self.hash_offsets[stop]
            hash_ids = self.hash_ids[lo:hi]
            hash_offsets = self.hash_offsets[start:stop + 1] - lo
        return Trace(self.arrival_s[start:stop], self.request_id[start:stop], self.batch[start:stop],
                     self.seq_len[start:stop], self.input_tokens[start:stop],
                     self.output_tokens[start:stop], self.priority[start:stop],
                     self.timeout_us[start:stop], hash_offsets, hash_ids, self.source, dict(self.meta))
