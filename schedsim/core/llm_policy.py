"""The LLM policy interface: a policy decides one engine step at a time.

As vLLM's scheduler exposes ``schedule()`` and ``update_from_output()`` and never calls
the model, an LLM policy answers "run this :class:`Step`" and is told when it ran. It
owns each request's progress (tokens computed, tokens generated, KV blocks); the driver
owns time and measurement. The same object runs in the simulator
(:mod:`schedsim.core.llm_simulate`) and, later, against a live engine.

Hooks, called by a driver in this order at each step boundary:

``reset(requests)``
    once: read-only request columns (prompt and output tokens, prefix keys).
``on_arrivals(now_ns, first, stop)``
    rows ``first .. stop-1`` arrived (all at or before ``now_ns``).
``schedule(now_ns) -> Step``
    the next step; one with no rows means "nothing to run until something arrives".
``on_step_done(now_ns, step, repeats)``
    the step ran ``repeats`` times back to back (see :attr:`Step.repeat`) and ended at ``now_ns``.
``stats() -> dict``
    at the end: counters for the summary.

Declared in :class:`LLMPolicy` with defaults, and read by the drivers: ``holds_responses``,
``kv_blocks_total``, ``block_size``, ``budget``, ``max_num_seqs``, ``max_num_batched_tokens``,
``async_scheduling`` and ``kv``.

A token is *emitted* by a row in a step whose computed tokens reach all the tokens the
request knows (prompt plus tokens generated so far); the request finishes when it has
emitted its ``output_tokens``. Times are integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedsim.core.policy import Reject, Requests
# Part of the interface: an LLM policy sizes its KV cache from a model spec and vLLM's memory
# arguments with kv_budget, so policies/ imports only the policy interfaces.
from schedsim.cost.kv_budget import KVBudget, kv_budget  # noqa: F401

SMALL = 48
"""Below this many values, Python on ``tolist()`` beats numpy: a numpy call costs ~1 us
whatever its size, and a simulated step often has a handful of rows."""

EMPTY_ROWS = np.empty(0, dtype=np.int64)
EMPTY_TOKENS = np.empty(0, dtype=np.int32)


@dataclass(eq=False, slots=True)
class Step:
    """One forward pass: which requests, how many tokens each, over how much context."""

    rows: np.ndarray = field(default_factory=lambda: EMPTY_ROWS)
    """int64 request rows in the step, in execution order."""
    num_tokens: np.ndarray = field(default_factory=lambda: EMPTY_TOKENS)
    """int32 tokens computed for each row this step: a prefill chunk, or 1 when decoding."""
    context: np.ndarray = field(default_factory=lambda: EMPTY_TOKENS)
    """int32 tokens already in each row's KV cache before this step (what its tokens attend over)."""
    emits: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    """bool: the row emits an output token at the end of this step (False for a prefill chunk
    short of the prompt's end, and for a finished row kept as padding by a static batch)."""
    repeat: int = 1
    """For a decode-only step: the policy would schedule the same rows, one token each, the
    same rows emitting, for ``repeat`` consecutive steps if nothing arrived in between. A
    driver that knows the next arrival may run up to that many at once (``repeats``); the
    live driver runs one. Contexts grow by one token per repeat."""
    rejects: list[Reject] = field(default_factory=list)
    """Requests refused now (e.g. longer than the model's maximum length)."""
    preempted: np.ndarray = field(default_factory=lambda: EMPTY_ROWS)
    """Rows preempted while forming this step (recompute or swap), in preemption order."""
    swap_out_blocks: int = 0
    """KV blocks copied to host memory before this step (swap preemption)."""
    swap_in_blocks: int = 0
    """KV blocks copied back from host memory before this step."""
    kv_blocks_used: int = 0
    """GPU KV blocks held by requests once this step's blocks are allocated."""
    waiting: int = 0
    """Requests waiting (arrived, not running) after this step was formed."""

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def decode_only(self) -> bool:
        return bool(len(self)) and bool((self.num_tokens == 1).all())


def int_max(a: np.ndarray) -> int:
    """The largest value of a non-empty integer array, as a Python int (fast on short ones)."""
    return max(a.tolist()) if a.shape[0] < SMALL else int(a.max())


class LLMPolicy:
    """Base class of iteration-level policies; subclasses implement ``schedule`` and ``on_step_done``.

    A user's own LLM policy subclasses this and is loaded like any policy
    (``--policy path/file.py:MyPolicy``); a driver tells the two kinds apart by ``llm = True``.
    The drivers read every hook and attribute below without asking whether it is there: a
    policy that does not subclass this must define them all (the defaults here will do).
    """

    name = "llm-policy"
    llm = True
    holds_responses = False
    """True when a request's response leaves with its batch's last step, not its own last
    token (a static batch): the drivers then end it there, and allow it padding steps."""
    kv_blocks_total = 0
    """GPU KV blocks the policy manages (for the result's occupancy figures); 0: none."""
    block_size: int | None = None
    """Tokens per KV block; a live engine must use the same. None: the policy does not care."""
    budget = None
    """The :class:`~schedsim.cost.kv_budget.KVBudget` the policy manages (``num_blocks``,
    ``max_model_len``): a live engine must hold its blocks, and is warmed up to its longest
    request. None: no budget (the engine's pool, no length limit)."""
    max_num_seqs: int | None = None
    """Most rows in one step (sizes a live engine's warm-up); None: not bounded by the policy."""
    max_num_batched_tokens: int | None = None
    """Most tokens in one step (sizes a live engine's warm-up); None: not bounded by the policy."""
    async_scheduling = False
    """True when the engine prepares the next step while one runs (vLLM's async scheduling):
    the simulator then overlaps each step's host time with its GPU time."""
    kv = None
    """The policy's own :class:`~policies.kv_cache.KVCacheManager` when it keeps block tables
    (the live driver then uses its blocks); None: the live driver allocates blocks itself."""

    def reset(self, requests: Requests) -> None:
        self.requests = requests

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        pass

    def schedule(self, now_ns: int) -> Step:
        raise NotImplementedError

    def on_step_done(self, now_ns: int, step: Step, repeats: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict:
        """Counters for the summary (preemptions, prefix-cache hits, ...)."""
        return {}
