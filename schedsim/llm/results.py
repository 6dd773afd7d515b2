"""The result of an LLM run: per-request token times and the step log.

Both LLM drivers (the simulator and the live engine runner) fill this table; the
metrics in :mod:`schedsim.llm.metrics` are vector expressions over it. Row = request
everywhere; -1 means "did not happen".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedsim.policy import Requests


@dataclass(eq=False)
class LLMResult:
    requests: Requests
    status: np.ndarray
    """int8 status codes of :mod:`schedsim.results` (COMPLETED, REJECTED_TOO_LONG, ...)."""
    scheduled_ns: np.ndarray
    """int64 when the request first ran in a step (its queueing ends), -1 if never."""
    first_token_ns: np.ndarray
    """int64 when its first output token was emitted, -1 if never."""
    end_ns: np.ndarray
    """int64 when its last output token was emitted (or when it was rejected), -1 if neither."""
    tokens_out: np.ndarray
    """int32 output tokens emitted."""
    preemptions: np.ndarray
    """int32 times the request was preempted."""
    prefix_hit_tokens: np.ndarray
    """int32 prompt tokens found in the prefix cache when it was (first) admitted."""
    itl_ns: np.ndarray
    """int64 inter-token gaps pooled over all requests (vLLM's ITL), as distinct values ..."""
    itl_count: np.ndarray
    """int64 ... each with how many gaps had that value (a step repeated k times for n
    requests contributes its duration n*(k-1) times)."""
    step_start_ns: np.ndarray
    """int64 start of each step record (a record may stand for several identical decode steps)."""
    step_end_ns: np.ndarray
    step_repeats: np.ndarray
    """int32 identical back-to-back steps in the record."""
    step_seqs: np.ndarray
    """int32 requests in the step."""
    step_tokens: np.ndarray
    """int32 tokens computed per step (prefill chunks plus decodes)."""
    step_prefill_tokens: np.ndarray
    """int32 of those tokens, the ones in prefill chunks (rows computing more than one token)."""
    step_kv_blocks: np.ndarray
    """int32 GPU KV blocks in use during the step (at the record's last step)."""
    step_waiting: np.ndarray
    """int32 requests waiting when the step was formed."""
    step_preempted: np.ndarray
    """int32 requests preempted while forming the step."""
    kv_blocks_total: int
    """GPU KV blocks the policy manages (0 when it does not page)."""
    seed: int = 0
    stats: dict = field(default_factory=dict)
    """The policy's counters (``LLMPolicy.stats()``): preemptions, prefix-cache lookups, ..."""
    meta: dict = field(default_factory=dict)
