"""The policy interface: pure decision objects.

A policy is told the time and what arrived or finished, and answers with a
:class:`Decision`: launch these batches on these idle instances, reject these
requests, and when to ask again. It never reads a clock, never sleeps, and imports
neither simpy nor an engine, so the same object runs in the simulator
(:mod:`schedsim.core.simulate`) and against a real engine, and its tests need neither.

Hooks, called by a driver in this order at each instant:

``reset(requests, instances)``
    once, before the run: the read-only request columns and the number of instances.
``on_batch_done(now_ns, instance, rows)``
    a batch finished; ``instance`` is idle again (``rows`` as launched: array or range).
``on_arrivals(now_ns, first, stop)``
    rows ``first .. stop-1`` arrived, in order, at their ``requests.arrival_ns``
    (all ``<= now_ns``). A driver may deliver arrivals late, in bulk, when the last
    decision said ``wake_on_arrival=False``: nothing else happened in between.
``on_trace_end(now_ns)``
    no request will arrive any more (lets a static batcher flush its remainder).
``decide(now_ns, idle) -> Decision``
    ``idle`` lists the idle instances, lowest first. Launch only on those.

Optional, for speed: ``queue_rule()``, called after ``reset``, may return a function
``rule(now_ns, head, tail) -> (take, wake_at_ns, arrivals_needed)`` when the policy's
queue is the consecutive rows ``[head, tail)`` and, on one idle instance, it launches
rows ``[head, head + take)`` (take 0: none) and otherwise waits as ``decide`` would;
``tail == len(requests)`` means the trace has ended. A driver of one instance may then
call the rule in place of the hooks above, keeping head and tail itself.

Declared in :class:`Policy` with defaults, and read by the drivers: ``preserve_ordering``
(responses leave in dispatch order) and ``max_batch_samples()`` (for checking the profile).

Times are integer nanoseconds: ties are exact and runs repeat bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NEVER = np.iinfo(np.int64).max
"""``wake_at_ns`` meaning "no timer"."""

# Why a request left without being served (status codes in the result table).
REJECT_QUEUE_FULL = "queue_full"
REJECT_TIMEOUT = "timeout"


@dataclass(frozen=True, eq=False)
class Requests:
    """What a policy may read about requests: read-only columns, row = request."""

    arrival_ns: np.ndarray
    """int64 arrival time in nanoseconds."""
    samples: np.ndarray
    """int32 samples the request carries (its batch dimension)."""
    seq_len: np.ndarray
    """int32 sequence length (0 = not given); requests of different seq_len do not share a batch."""
    priority: np.ndarray
    """int16 priority level (0 = the policy's default level)."""
    timeout_ns: np.ndarray
    """int64 per-request timeout (0 = none)."""
    input_tokens: np.ndarray
    """int32 prompt tokens (LLM policies)."""
    output_tokens: np.ndarray
    """int32 tokens to generate (LLM policies)."""
    hash_offsets: np.ndarray | None = None
    """int64, n+1: row i's prefix-block hash ids are ``hash_ids[hash_offsets[i]:hash_offsets[i+1]]``."""
    hash_ids: np.ndarray | None = None
    """int64 prefix-block hash ids from the trace (Mooncake's 512-token blocks); None if none."""
    hash_block_tokens: int = 512
    """Prompt tokens each hash id names."""

    def __len__(self) -> int:
        return int(self.arrival_ns.shape[0])

    def head(self, keep: int) -> "Requests":
        """The first ``keep`` requests."""
        hash_offsets = None if self.hash_offsets is None else self.hash_offsets[:keep + 1]
        return Requests(self.arrival_ns[:keep], self.samples[:keep], self.seq_len[:keep],
                        self.priority[:keep], self.timeout_ns[:keep], self.input_tokens[:keep],
                        self.output_tokens[:keep], hash_offsets, self.hash_ids, self.hash_block_tokens)

    @classmethod
    def from_trace(cls, trace) -> "Requests":
        # Round to the nearest nanosecond once, here, so every driver sees the same ints.
        arrival_ns = np.rint(trace.arrival_s * 1e9).astype(np.int64)
        cols = [arrival_ns, trace.batch, trace.seq_len, trace.priority,
                trace.timeout_us.astype(np.int64) * 1000, trace.input_tokens, trace.output_tokens]
        arrival_ns.flags.writeable = False
        return cls(*cols, hash_offsets=trace.hash_offsets, hash_ids=trace.hash_ids,
                   hash_block_tokens=int(trace.meta.get("hash_block_tokens", 512)))


@dataclass(frozen=True, eq=False, slots=True)
class Launch:
    """Run ``rows`` (request rows, in batch order) as one batch on ``instance``."""

    instance: int
    rows: np.ndarray | range
    """An integer array, or a ``range`` when the rows are consecutive (cheaper to apply)."""


@dataclass(frozen=True, eq=False)
class Reject:
    """Answer ``rows`` with an error without running them."""

    rows: np.ndarray
    reason: str


@dataclass(eq=False, slots=True)
class Decision:
    """A policy's answer at one instant."""

    launches: list[Launch] = field(default_factory=list)
    """Batches to start now, each on a distinct idle instance."""
    rejects: list[Reject] = field(default_factory=list)
    """Requests answered with an error now."""
    wake_at_ns: int = NEVER
    """Ask again at this time even if nothing else happens (queue delay, timeouts)."""
    wake_on_arrival: bool = True
    """Whether arrivals may change the answer; False lets a driver deliver them later, in bulk."""
    arrivals_needed: int = 1
    """With ``wake_on_arrival``: how many more arrivals it takes before the answer can change
    (e.g. until the queue reaches the next preferred size); the driver wakes at that one."""


class Policy:
    """Base class with do-nothing hooks; subclasses override ``decide`` and what they need.

    A user's own policy subclasses this and is loaded with ``--policy path/to/file.py:MyPolicy``
    or ``--policy module:MyPolicy``. The drivers read every hook and attribute below without
    asking whether it is there: a policy that does not subclass this must define them all
    (the defaults here will do).
    """

    name = "policy"
    preserve_ordering = False
    """When true, a response leaves only after every earlier-dispatched request's."""

    def reset(self, requests: Requests, instances: int) -> None:
        self.requests = requests
        self.instances = instances

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        pass

    def on_batch_done(self, now_ns: int, instance: int, rows: np.ndarray) -> None:
        pass

    def on_trace_end(self, now_ns: int) -> None:
        pass

    def decide(self, now_ns: int, idle: list[int]) -> Decision:
        raise NotImplementedError

    def max_batch_samples(self) -> int | None:
        """Largest batch (in samples) this policy may launch, for checking the profile covers it."""
        return None

    def queue_rule(self):
        """The decision as a function of the queue's rows alone, or None (see the module docstring)."""
        return None
