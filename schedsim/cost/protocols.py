"""The seams between the drivers and the cost models: what a driver may ask of one.

A request-level driver (:mod:`schedsim.core.simulate`) asks a :class:`BatchCost` how long
a batch takes; the LLM driver (:mod:`schedsim.core.llm_simulate`) asks a :class:`StepCost`
how long a step takes. Each protocol names its one required method and declares every
optional capability as a member that is always present, with a neutral default, so a
driver reads the capability instead of probing for it:

=====================  ==============================  ==================================
capability             member                          absent
=====================  ==============================  ==================================
wake-up of idle loop   ``wake_ns(idle_ns, u)``         ``wake_overhead_s`` (0 s) each time
random wake-up         ``wake_is_random``              False: no draw per wake-up
power cap              ``power_cap``, ``dispatch_s``   None: every batch at the profile's clock
concurrency            ``at_concurrency(busy)``        itself: no contention model
pair grid              ``pair_slowdown``               None: instances do not share a GPU
one draw per batch     ``one_draw_per_sample``         False: the driver passes its Generator
decode runs            ``decode_run_ns(context, k)``   ``step_ns`` step by step
run segments           ``decode_run_segments``         None: runs priced as arrays
state across steps     ``begin_run()``                 nothing to reset
=====================  ==============================  ==================================

A cost model declares its capabilities by subclassing the protocol (the defaults come
with it) and overriding what it has, as :class:`~schedsim.cost.model.CostModel` does; an
object with every member is one too. Any other object with the required method (a
user's cost model with only ``sample_s``, say) runs with no optional capability: the
drivers wrap it once with :func:`batch_cost` / :func:`step_cost`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from schedsim.core.contention import PairSlowdown
    from schedsim.cost.power import PowerCap


@runtime_checkable
class BatchCost(Protocol):
    """How long one batch takes: ``sample_s`` required, the rest declared capabilities."""

    power_cap: "PowerCap | None" = None
    """How a power-capped GPU's clock follows recent load (:mod:`schedsim.cost.power`), or None.
    With one, ``dispatch_s`` says which part of a batch's time the clock does not scale."""
    pair_slowdown: "PairSlowdown | None" = None
    """How a batch slows beside another instance's batch on one GPU, by both sizes
    (:mod:`schedsim.core.contention`), or None."""
    wake_is_random: bool = False
    """Whether :meth:`wake_ns` depends on its draw ``u``: the driver then draws one per wake-up
    from a stream of its own."""
    wake_overhead_s: float = 0.0
    """The wake-up cost as one constant, what the default :meth:`wake_ns` charges."""
    one_draw_per_sample: bool = False
    """Whether every :meth:`sample_s` call consumes exactly one ``rng.random()`` and nothing
    else: the driver may then serve the draws from blocks (the same numbers, fewer calls)."""

    def sample_s(self, samples: int, seq_len: int, rng: np.random.Generator) -> float:
        """One random service time in seconds of a batch of ``samples`` samples at ``seq_len``."""
        ...

    def wake_ns(self, idle_ns: int, u: float = 0.5) -> int:
        """Extra nanoseconds of a batch launched on an instance idle for ``idle_ns`` (its
        serving loop must wake up); ``u`` in [0, 1) is the draw when :attr:`wake_is_random`."""
        return int(round(self.wake_overhead_s * 1e9))

    def dispatch_s(self, samples: int) -> float:
        """The host part of a batch's time, in seconds, which a GPU clock does not scale."""
        return 0.0

    def at_concurrency(self, instances_busy: int) -> "BatchCost":
        """The model for a batch launched while ``instances_busy`` instances (itself
        included) run on the GPU: a contention model measured so, or this one."""
        return self


@runtime_checkable
class StepCost(Protocol):
    """How long one LLM engine step takes: ``step_ns`` required, the rest declared capabilities."""

    decode_run_segments: "Callable[[np.ndarray, int], tuple[list[int], list[int]]] | None" = None
    """``(context, k) -> (counts, prices)``: :meth:`decode_run_ns` run-length encoded, or None;
    with it the driver finds where a run stops without building the array."""

    host_ns: "Callable[[int], int] | None" = None
    """``rows -> ns`` of a step's host time (the engine's per-step overhead and the serving
    loop) within ``step_ns``, which an engine with async scheduling overlaps with the GPU
    work of the step before; None: not separable."""

    draft_ns: "Callable[[np.ndarray, int], int] | None" = None
    """``(context, k) -> ns`` the speculative-decoding proposer takes to draft ``k`` tokens
    for rows with these contexts; None: drafting is free."""

    def step_ns(self, num_tokens: np.ndarray, context: np.ndarray, swap_blocks: int = 0) -> int:
        """Duration of one step whose rows compute ``num_tokens`` tokens each over ``context``
        cached ones, after copying ``swap_blocks`` KV blocks to or from host memory."""
        ...

    def decode_run_ns(self, context: np.ndarray, k: int) -> np.ndarray:
        """int64 durations of ``k`` back-to-back decode-only steps of the same rows, contexts
        growing by one per step: ``step_ns`` of each, in order."""
        ones = np.ones(context.shape[0], dtype=np.int32)
        return np.array([self.step_ns(ones, context + j) for j in range(k)], dtype=np.int64)

    def begin_run(self) -> None:
        """Start pricing a run afresh (a model with state across steps resets it here)."""


class _PlainBatchCost(BatchCost):
    """A cost model that has only ``sample_s``: no optional capability."""

    def __init__(self, model):
        self.model = model
        self.sample_s = model.sample_s


class _PlainStepCost(StepCost):
    """A step cost model that has only ``step_ns``: no optional capability."""

    def __init__(self, model):
        self.model = model
        self.step_ns = model.step_ns


def batch_cost(cost) -> BatchCost:
    """``cost`` as a :class:`BatchCost`: itself when it declares the protocol, else wrapped
    with no optional capability."""
    return cost if isinstance(cost, BatchCost) else _PlainBatchCost(cost)


def step_cost(cost) -> StepCost:
    """``cost`` as a :class:`StepCost`: itself when it declares the protocol, else wrapped
    with no optional capability."""
    return cost if isinstance(cost, StepCost) else _PlainStepCost(cost)
