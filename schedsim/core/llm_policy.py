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
    the step ran ``repeats`` times back to back (see :attr:`Step.repeat`) and ended at ``now_ns``;
    for a step with :attr:`Step.then`, the step and then ``repeats - 1`` of that decode step.
``on_arrivals_in_run(now_ns, first, stop) -> bool``
    only during a run of a step marked :attr:`Step.arrivals_wait`: rows ``first .. stop-1``
    arrived by ``now_ns``, the end of one of the run's steps (before the run's
    ``on_step_done``); True when the rest of the run stands, False to stop it after that step.
``stats() -> dict``
    at the end: counters for the summary.

Declared in :class:`LLMPolicy` with defaults, and read by the drivers: ``holds_responses``,
``kv_blocks_total``, ``block_size``, ``budget``, ``max_num_seqs``, ``max_num_batched_tokens``,
``async_scheduling``, ``speculative``, ``caps_long_requests`` and ``kv``.

A token is *emitted* by a row in a step whose computed tokens reach all the tokens the
request knows (prompt plus tokens generated so far); the request finishes when it has
emitted its ``output_tokens``. Times are integer nanoseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from schedsim.core.policy import Reject, Requests
from schedsim.errors import InputError
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
    emit_tokens: np.ndarray | None = None
    """int32 tokens each row emits at the end of the step (speculative decoding: the accepted
    draft tokens plus one; 0 where it emits nothing); None: one per row that ``emits``."""
    verify_only: bool = False
    """Every row decodes, some verifying draft tokens: the engine runs it as a uniform-decode
    CUDA graph, and the simulator prices it as a decode step of one row per token (a row of
    n tokens over context c as n rows over c, c + 1, ..., c + n - 1)."""
    draft_tokens: int = 0
    """Draft tokens proposed after this step for each row that emits (speculative decoding:
    the draft model's work, priced apart from the step's forward pass)."""
    arrivals_wait: bool = False
    """For a repeatable step: requests wait that the policy cannot start before the run
    ends, and a request arriving meanwhile would wait behind them. A driver running the
    repeats at once may then go on past an arrival: it delivers it with
    :meth:`LLMPolicy.on_arrivals_in_run` at the end of the step during which it arrived,
    and stops the run there only when that answers False."""

    then: "Step | None" = None
    """A repeatable decode step (:attr:`repeat`) the policy would schedule right after this
    one if nothing arrived before this one ends: this step's rows, every one of which
    emits now and none finishes. A driver that knows the next arrival may run this step
    and up to ``then.repeat`` of those in one go, and then tells :meth:`LLMPolicy.on_step_done`
    how many steps ran in all (``repeats`` counts this one: 1 means this one alone); the
    live driver runs this one alone."""

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def decode_only(self) -> bool:
        return bool(len(self)) and bool((self.num_tokens == 1).all())


SPEC_METHODS = ("ngram", "suffix", "eagle", "eagle3", "mtp", "medusa", "draft_model")
DEFAULT_DRAFT_FRACTION = {"ngram": 0.0, "suffix": 0.0, "draft_model": 0.2}
"""A draft token's cost as a share of a target decode step of the same rows, where no draft
profile is given: proposers that match the prompt's n-grams run on the host (0); a separate
draft model 0.2; a head on the target (EAGLE, MTP, Medusa) 0.1 (the default). Stated in a
run's notes whenever used: a guess to replace with a measured draft profile."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config`` (method, num_speculative_tokens) plus how often drafts
    are accepted, which the simulator needs and vLLM measures."""

    method: str
    """The proposer: ngram, suffix, eagle, eagle3, mtp, medusa or draft_model."""
    num_speculative_tokens: int
    """Draft tokens proposed per request per step (k)."""
    acceptance: tuple[float, ...]
    """Per-position acceptance rates, as vLLM reports them: the share of steps whose i-th
    draft token was accepted (all before it accepted too); non-increasing, one per position."""
    draft_profile: str | None = None
    """A step profile of the draft model, to price its k steps; None: ``draft_cost_fraction``."""
    draft_cost_fraction: float | None = None
    """A draft token's cost as a share of a target decode step (None: the method's default,
    :data:`DEFAULT_DRAFT_FRACTION`)."""
    seed: int = 0
    """Seed of the acceptance draws (one uniform per verifying row per step)."""

    @property
    def draft_fraction(self) -> float:
        if self.draft_cost_fraction is not None:
            return self.draft_cost_fraction
        return DEFAULT_DRAFT_FRACTION.get(self.method, 0.1)

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig":
        """From the JSON text (or dict) of ``--speculative-config``: ``method``,
        ``num_speculative_tokens``, and ``acceptance_rate`` (each draft token accepted with
        this probability given the ones before it were) or ``acceptance_profile`` (the
        per-position rates); optional ``draft_profile``, ``draft_cost_fraction``, ``seed``."""
        def bad(what: str):
            return InputError(f"--speculative-config: {what}")

        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise bad(f"not JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(value, dict):
            raise bad(f"{value!r} is not a JSON object")
        known = {"method", "num_speculative_tokens", "acceptance_rate", "acceptance_profile",
                 "draft_profile", "draft_cost_fraction", "seed", "model"}
        extra = sorted(set(value) - known)
        if extra:
            raise bad(f"unknown field {extra[0]!r}; expected {', '.join(sorted(known))}")
        method = value.get("method")
        if method not in SPEC_METHODS:
            raise bad(f"method {method!r} is not valid; expected one of {', '.join(SPEC_METHODS)}")
        k = value.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise bad(f"num_speculative_tokens {k!r} is not valid; expected an integer >= 1")
        rate, profile = value.get("acceptance_rate"), value.get("acceptance_profile")
        if (rate is None) == (profile is None):
            raise bad("give one of acceptance_rate (0..1) or acceptance_profile (one rate per position)")
        if rate is not None:
            if not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
                raise bad(f"acceptance_rate {rate!r} is not valid; expected a number in [0, 1]")
            acceptance = tuple(float(rate) ** (i + 1) for i in range(k))
        else:
            if (not isinstance(profile, list) or len(profile) != k
                    or not all(isinstance(a, (int, float)) and 0.0 <= a <= 1.0 for a in profile)):
                raise bad(f"acceptance_profile {profile!r} is not valid; expected {k} numbers in [0, 1]")
            if any(b > a for a, b in zip(profile, profile[1:])):
                raise bad(f"acceptance_profile {profile!r} increases; a position is accepted only "
                          "when every one before it is")
            acceptance = tuple(float(a) for a in profile)
        fraction = value.get("draft_cost_fraction")
        if fraction is not None and (not isinstance(fraction, (int, float)) or fraction < 0):
            raise bad(f"draft_cost_fraction {fraction!r} is not valid; expected a number >= 0")
        seed = value.get("seed", 0)
        if not isinstance(seed, int) or seed < 0:
            raise bad(f"seed {seed!r} is not valid; expected an integer >= 0")
        return cls(method, k, acceptance, value.get("draft_profile"),
                   None if fraction is None else float(fraction), seed)


def int_max(a: np.ndarray) -> int:
    """The largest value of a non-empty integer array, as a Python int (fast on short ones)."""
    return max(a.tolist()) if a.shape[0] < SMALL else int(_maximum(a))


_maximum = np.maximum.reduce   # ndarray.max without its Python-level wrapper


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
    caps_long_requests = False
    """True when a request longer than ``budget.max_model_len`` (or the KV cache) runs until
    that limit, its prompt and one token fitting, instead of being rejected (current vLLM)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding, when the policy runs it: rows verify several tokens a step."""
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

    def on_arrivals_in_run(self, now_ns: int, first: int, stop: int) -> bool:
        """Rows ``first .. stop-1`` arrived during a run of repeated steps that the policy
        marked :attr:`Step.arrivals_wait`, by ``now_ns``, the end of one of its steps (the
        run's :meth:`on_step_done` comes later). Deliver them as :meth:`on_arrivals` does
        and answer whether the rest of the run stands: False (the default) stops it after
        that step, as if they had arrived with no run under way."""
        self.on_arrivals(now_ns, first, stop)
        return False

    def schedule(self, now_ns: int) -> Step:
        raise NotImplementedError

    def on_step_done(self, now_ns: int, step: Step, repeats: int) -> None:
        raise NotImplementedError

    def stats(self) -> dict:
        """Counters for the summary (preemptions, prefix-cache hits, ...)."""
        return {}
