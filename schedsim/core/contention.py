"""Instances sharing one GPU: how much a batch slows beside the other instances' batches.

Two instances of a model on one GPU (Triton's ``instance_group { count: 2 }``) run their
batches on separate streams, and the GPU interleaves their kernels. How much each slows
depends on both sizes, not on how many instances are busy: on the H200 with bert-base,
two batches of 64 each took 1.96x their time alone (the GPU runs them one after the
other), but a batch of 64 beside a batch of 1 took only 1.08x, while the batch of 1 took
4.0x (experiments/fidelity/calibration/asymmetric_contention.json). A profile measured
with both instances at the same size (``schedsim profile --instances 2``) knows only the
diagonal, and charges a large batch beside a small one about twice its time.

A two-instance profile's sidecar may carry the measured grid as ``pair_slowdown``:

    {"batch": [1, 2, 4, ...],            # sizes measured, increasing
     "slowdown": [[...], ...],           # slowdown[i][j]: a batch of batch[i] beside
                                         #   back-to-back batches of batch[j], over its time alone
     "seq_len": 128, "pair_s": 0.3}      # where and how long each pair was measured

:class:`SharedGpu` follows the batches running on one GPU's instances as processor
sharing: a batch's time alone (the one-instance table's draw) is work, done at rate 1
while it runs alone and at 1 / slowdown while other instances run batches; when a batch
starts or ends, the others' remaining work is re-timed. Beside one other batch the
slowdown is the pair grid's, so back to back on both sides this reproduces the measured
pair exactly, and partial overlaps are interpolated in time. Beside several, each adds
its own excess: ``1 + sum over the others of (slowdown(own, other) - 1)``. On the H200,
against 92 batches of 3 and 4 instances run back to back (sizes 1, 8, 32 and 64;
experiments/fidelity/calibration/multi_contention.json), that rule was within a median
5.3% (3 instances 5.1%, 4 instances 5.7%); its worst case is a small batch beside three
large ones, 33% low (17.1x measured). Taking the pair grid at the others' summed size
did 6.0% (worst 39%), multiplying the pairs' slowdowns 26.6%.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from schedsim.errors import InputError


class PairSlowdown:
    """The measured slowdown of a batch by its own size and the co-running batch's size."""

    def __init__(self, batch, slowdown, *, source: str = "pair_slowdown", **extra):
        try:
            b = [int(x) for x in batch]
            grid = [[float(v) for v in row] for row in slowdown]
        except (TypeError, ValueError):
            raise InputError(f"{source}: batch must be a list of integers and slowdown a list of "
                             "lists of numbers") from None
        if not b or any(x < 1 for x in b) or any(y <= x for x, y in zip(b, b[1:])):
            raise InputError(f"{source}: batch must be non-empty, >= 1 and strictly increasing")
        if len(grid) != len(b) or any(len(row) != len(b) for row in grid):
            raise InputError(f"{source}: slowdown must be a {len(b)}x{len(b)} grid (one row and one "
                             "column per batch size)")
        if not all(math.isfinite(v) and v > 0 for row in grid for v in row):
            raise InputError(f"{source}: slowdown entries must be finite numbers > 0")
        self.batch, self.grid, self.extra = b, grid, extra
        self._memo: dict[tuple[int, int], float] = {}

    @classmethod
    def from_meta(cls, meta: dict, source: str) -> "PairSlowdown | None":
        """The sidecar's ``pair_slowdown``, or None when it has none."""
        pairs = meta.get("pair_slowdown")
        if pairs is None:
            return None
        if not isinstance(pairs, dict):
            raise InputError(f"{source}: pair_slowdown must be an object with batch and slowdown")
        extra = {k: v for k, v in pairs.items() if k not in ("batch", "slowdown")}
        return cls(pairs.get("batch") or [], pairs.get("slowdown") or [],
                   source=f"{source}: pair_slowdown", **extra)

    def slowdown(self, own: int, other: int) -> float:
        """Time of a batch of ``own`` samples beside ``other``'s over its time alone: bilinear
        in the two sizes between measured ones, flat beyond them, never below 1 (sharing the
        GPU does not speed a batch up; a ratio a little under 1 is measurement noise)."""
        key = (own, other)
        s = self._memo.get(key)
        if s is None:
            i0, i1, wi = _bracket(own, self.batch)
            j0, j1, wj = _bracket(other, self.batch)
            g = self.grid
            top = g[i0][j0] + wj * (g[i0][j1] - g[i0][j0])
            bottom = g[i1][j0] + wj * (g[i1][j1] - g[i1][j0])
            s = self._memo[key] = max(1.0, top + wi * (bottom - top))
        return s

    def describe(self) -> dict:
        return {"batch": self.batch, "slowdown": self.grid, **self.extra}


def _bracket(x: int, xs: list[int]) -> tuple[int, int, float]:
    """(i0, i1, w) with x = xs[i0] + w (xs[i1] - xs[i0]) inside; the end point outside."""
    k = bisect_left(xs, x)
    if k < len(xs) and xs[k] == x:
        return k, k, 0.0
    if k == 0:
        return 0, 0, 0.0
    if k == len(xs):
        return k - 1, k - 1, 0.0
    return k - 1, k, (x - xs[k - 1]) / (xs[k] - xs[k - 1])


class SharedGpu:
    """The batches running on one GPU's instances, re-timed as processor sharing.

    Work is in nanoseconds of the batch's time alone. :meth:`start` and :meth:`finish`
    change who runs; :meth:`retime` then gives each running batch whose end moved its
    new end and a generation number, so that the driver can ignore the completion it had
    scheduled before (simpy events cannot be cancelled)."""

    def __init__(self, pairs: PairSlowdown):
        self.pairs = pairs
        # instance -> [work left (ns alone), rate, since (ns), samples, end (ns), generation, payload]
        self.running: dict[int, list] = {}
        self.generation = 0

    def start(self, instance: int, now: int, alone_ns: int, samples: int, payload) -> None:
        """A batch of ``samples`` that would take ``alone_ns`` alone starts on ``instance``."""
        self._advance(now)
        self.running[instance] = [float(alone_ns), 1.0, now, samples, None, -1, payload]

    def is_current(self, instance: int, generation: int) -> bool:
        """Whether a completion scheduled with ``generation`` is still the batch's end."""
        state = self.running.get(instance)
        return state is not None and state[5] == generation

    def finish(self, instance: int, now: int):
        """The batch on ``instance`` ends at ``now``; returns its payload."""
        self._advance(now)
        return self.running.pop(instance)[6]

    def retime(self, now: int) -> list[tuple[int, int, int]]:
        """(instance, end ns, generation) of every running batch whose end changed."""
        self._advance(now)
        running = self.running
        changed = []
        slowdown = self.pairs.slowdown
        for instance, state in running.items():
            own = state[3]
            # Each other running batch adds its own pairwise excess (module docstring).
            rate = 1.0 / (1.0 + sum(slowdown(own, s[3]) - 1.0 for i, s in running.items() if i != instance))
            state[1] = rate
            # (less a hair, so float rounding of the work left never adds a nanosecond)
            end = now + max(0, math.ceil(state[0] / rate - 1e-6))
            if end != state[4]:
                self.generation += 1
                state[4], state[5] = end, self.generation
                changed.append((instance, end, self.generation))
        return changed

    def _advance(self, now: int) -> None:
        for state in self.running.values():
            if now > state[2]:
                state[0] = max(0.0, state[0] - (now - state[2]) * state[1])
                state[2] = now
