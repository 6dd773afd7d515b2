"""Running a user's own request-level policy so that its mistakes end the run with one line.

A policy written against :class:`~schedsim.core.policy.Policy` can go wrong in ways the
drivers cannot tell from a slow run: it keeps asking to be woken (a timer re-armed at
``now + 1 ns`` while every instance is busy) with nothing arriving, finishing, launching or
being rejected in between, so simulated time crawls and the run never ends; or it leaves
requests queued with every instance idle and no timer, so the run ends with nothing served.
:class:`GuardedPolicy` wraps the user's object (the built-in policies are not wrapped: they
cost the drivers nothing extra) and turns both, and any exception its code raises, into an
:class:`~schedsim.errors.InputError` naming the policy and the simulated time.
"""

from __future__ import annotations

import numpy as np

from schedsim.core.policy import Policy
from schedsim.core.results import QUEUED, PolicyError
from schedsim.errors import InputError

SPIN_LIMIT = 100_000
"""Wake-ups in a row with nothing new to decide on that make a policy a spinning one: a
policy that waits for a time asks for that time, and one that waits for an event asks to be
woken on arrivals; nothing else changes its answer."""

SPIN_SHARE = 100
"""... or, over the run, more than ten times :data:`SPIN_LIMIT` such wake-ups and more than
this many per event (arrival, completion, launch): a policy spinning between arrivals that
come too often for a streak to reach the limit."""


class PolicySpins(PolicyError):
    """A policy asked to be woken :data:`SPIN_LIMIT` times in a row with nothing changing."""


class GuardedPolicy(Policy):
    """``inner``, a user's policy, with its hooks forwarded and its failures made one line."""

    def __init__(self, inner, label: str):
        self.inner, self.label = inner, label
        self.name = getattr(inner, "name", type(inner).__name__)
        self.preserve_ordering = bool(getattr(inner, "preserve_ordering", False))
        self._news = 0          # arrivals, completions and trace ends seen so far
        self._news_at_last = -1
        self._streak = 0
        self._streak_from_ns = 0
        self._idle_wakes = 0    # wake-ups with nothing new, over the run
        self._events = 0        # decisions that had news, launched or rejected

    def _call(self, hook: str, now_ns, *args):
        try:
            return getattr(self.inner, hook)(*args)
        except (PolicyError, InputError):
            raise
        except Exception as exc:  # the user's code failed: where and when, one line
            raise InputError(f"--policy {self.label}: {hook} raised {type(exc).__name__}: {exc}"
                             + (f" (at t = {now_ns / 1e9:.9f} s)" if now_ns is not None else "")
                             + _where(exc)) from exc

    def reset(self, requests, instances: int) -> None:
        self.requests, self.instances = requests, instances
        self._news, self._news_at_last, self._streak, self._idle_wakes, self._events = 0, -1, 0, 0, 0
        self._call("reset", None, requests, instances)

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        self._news += 1
        self._call("on_arrivals", now_ns, now_ns, first, stop)

    def on_batch_done(self, now_ns: int, instance: int, rows) -> None:
        self._news += 1
        self._call("on_batch_done", now_ns, now_ns, instance, rows)

    def on_trace_end(self, now_ns: int) -> None:
        self._news += 1
        self._call("on_trace_end", now_ns, now_ns)

    def decide(self, now_ns: int, idle: list[int]):
        decision = self._call("decide", now_ns, now_ns, idle)
        if getattr(decision, "launches", None) or getattr(decision, "rejects", None) \
                or self._news != self._news_at_last:
            self._streak, self._streak_from_ns = 0, now_ns
            self._events += 1
        else:
            self._streak += 1
            self._idle_wakes += 1
            if self._streak >= SPIN_LIMIT:
                raise PolicySpins(
                    f"--policy {self.label}: woke {self._streak:,} times in a row between t = "
                    f"{self._streak_from_ns / 1e9:.9f} s and {now_ns / 1e9:.9f} s with nothing arriving, "
                    f"finishing, launching or being rejected: {_SPINS}")
            if self._idle_wakes >= 10 * SPIN_LIMIT and self._idle_wakes > SPIN_SHARE * self._events:
                raise PolicySpins(
                    f"--policy {self.label}: by t = {now_ns / 1e9:.9f} s it woke {self._idle_wakes:,} times "
                    f"with nothing arriving, finishing, launching or being rejected, against {self._events:,} "
                    f"times with something to decide on: {_SPINS}")
        self._news_at_last = self._news
        return decision

    def max_batch_samples(self):
        return self._call("max_batch_samples", None)


_SPINS = ("it spins on its timer (ask to be woken at the time that changes the answer, "
          "or on arrivals)")


def _where(exc: BaseException) -> str:
    """`` in FILE line N`` of the innermost frame of ``exc``'s traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    return f" in {tb.tb_frame.f_code.co_filename} line {tb.tb_lineno}"


def guard(policy, spec: str):
    """``policy`` wrapped in :class:`GuardedPolicy` when ``spec`` names a user's class."""
    return GuardedPolicy(policy, spec) if ":" in spec else policy


def unwrap(policy):
    """The user's own object inside a :class:`GuardedPolicy` (else ``policy``)."""
    return policy.inner if isinstance(policy, GuardedPolicy) else policy


def check_served(result, label: str) -> None:
    """InputError when the run ended with requests still queued: the policy left them with
    every instance idle and neither launched them nor asked to be woken."""
    queued = np.flatnonzero(result.status == QUEUED)
    if not queued.size:
        return
    ends = result.batch_end_ns
    stuck_ns = max(int(result.requests.arrival_ns[queued].max()), int(ends.max()) if ends.size else 0)
    raise InputError(f"--policy {label}: stopped at t = {stuck_ns / 1e9:.9f} s with {queued.size:,} "
                     "requests queued and every instance idle: it neither launched them nor asked to be "
                     "woken (a timer), so they would never be served")
