"""The per-request result table both drivers produce (the simulator and the live runner).

No simpy here: the live runner, which runs on GPU machines without it, shares this type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedsim.core.policy import Decision, Requests

# Per-request status codes (the ``status`` column).
QUEUED, RUNNING, COMPLETED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT, FAILED, REJECTED_TOO_LONG = range(7)
STATUS_NAMES = ("unfinished", "running", "completed", "rejected_queue_full", "rejected_timeout",
                "failed", "rejected_too_long")
REJECT_STATUS = {"queue_full": REJECTED_QUEUE_FULL, "timeout": REJECTED_TIMEOUT,
                 "too_long": REJECTED_TOO_LONG}
"""Status code for each ``Reject.reason``."""


class PolicyError(RuntimeError):
    """A policy broke a driver's contract (a bug in the policy, not bad input)."""


def ask(policy, now_ns: int, idle: list[int]) -> Decision:
    """``policy.decide`` with the checks both drivers need before applying the answer."""
    return checked(policy, policy.decide(now_ns, idle), now_ns)


def checked(policy, decision, now_ns: int) -> Decision:
    """``decision`` if it is one a driver can apply at ``now_ns``; else PolicyError."""
    if not isinstance(decision, Decision):
        raise PolicyError(f"{type(policy).__name__}.decide returned {decision!r}, not a Decision")
    if decision.wake_at_ns <= now_ns:
        raise PolicyError(f"{type(policy).__name__} asked to wake at {decision.wake_at_ns} ns, "
                          f"not after now ({now_ns} ns)")
    return decision


@dataclass(eq=False)
class SimResult:
    """The per-request table (row = request, units in names) and the batch log."""

    requests: Requests
    start_ns: np.ndarray
    end_ns: np.ndarray
    """Response time: completion, delayed by preserve_ordering when the policy asks for it."""
    batch_size: np.ndarray
    """Samples in the batch the request ran in (0 if it did not run)."""
    instance: np.ndarray
    status: np.ndarray
    batch_start_ns: np.ndarray
    batch_end_ns: np.ndarray
    batch_instance: np.ndarray
    batch_samples: np.ndarray
    batch_requests: np.ndarray
    instances: int
    seed: int
    decisions: list | None = None
    """With ``record=True``: (time_ns, "launch"|reason, instance, rows) in decision order."""
    meta: dict = field(default_factory=dict)
