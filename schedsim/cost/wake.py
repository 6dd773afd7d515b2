"""The cost of waking an idle serving loop, as a function of how long it slept.

A batch launched the instant its instance finished the previous one pays only the
dispatch overhead. A batch that finds the loop idle pays more: the dispatcher thread
and the engine's worker must wake, and caches and clocks have cooled. On the H200 the
extra grew from about 100 µs after 0.1 ms of idling to about 690 µs after 58 ms
(experiments/fidelity/README.md, "wake-up cost"), so one constant over-charges the
short gaps of a moderately loaded server and under-charges long ones.

A :class:`WakeCurve` holds measured points (idle time, extra time) and interpolates
linearly in the logarithm of the idle time, flat beyond both ends. A profile's sidecar
carries it as ``wake_curve``: ``{"idle_us": [...], "extra_us": [...]}`` (plus provenance).
The wake-up varies a lot from launch to launch (at 0.2-0.5 ms of idling: mean 109 µs,
p90 about twice that), and that spread is what a p99 sees, so a curve may also carry
each point's quantiles, ``probs`` and ``extra_q_us`` (one list per point); then a draw
``u`` in [0, 1) picks the extra from the quantile function instead of the mean.
"""

from __future__ import annotations

import bisect
import math

from schedsim.errors import InputError


class WakeCurve:
    """Extra time of a launch on a loop idle for ``idle``: points interpolated in log idle."""

    def __init__(self, idle_us, extra_us, *, probs=None, extra_q_us=None, source: str = "wake_curve"):
        idle, extra = list(map(float, idle_us)), list(map(float, extra_us))
        if not idle or len(idle) != len(extra):
            raise InputError(f"{source}: idle_us and extra_us must be non-empty lists of the same length")
        if not all(math.isfinite(v) and v > 0 for v in idle) or any(b <= a for a, b in zip(idle, idle[1:])):
            raise InputError(f"{source}: idle_us must be finite, > 0 and strictly increasing")
        if not all(math.isfinite(v) and v >= 0 for v in extra):
            raise InputError(f"{source}: extra_us must be finite numbers >= 0")
        self.idle_us, self.extra_us = idle, extra
        self._log_idle = [math.log(v) for v in idle]
        self.probs = self.extra_q_us = None
        if probs is not None or extra_q_us is not None:
            probs = list(map(float, probs or []))
            q = [list(map(float, row)) for row in (extra_q_us or [])]
            if len(probs) < 2 or probs[0] != 0.0 or probs[-1] != 1.0 or any(b <= a for a, b in zip(probs, probs[1:])):
                raise InputError(f"{source}: probs must rise strictly from 0 to 1")
            if len(q) != len(idle) or any(len(row) != len(probs) for row in q) \
                    or any(not (math.isfinite(v) and v >= 0) for row in q for v in row) \
                    or any(b < a for row in q for a, b in zip(row, row[1:])):
                raise InputError(f"{source}: extra_q_us must hold, for each idle point, one non-decreasing "
                                 f"list of {len(probs)} finite numbers >= 0")
            self.probs, self.extra_q_us = probs, q

    @classmethod
    def from_meta(cls, meta: dict, source: str) -> "WakeCurve | None":
        """The sidecar's ``wake_curve``, or None when it has none."""
        curve = meta.get("wake_curve")
        if curve is None:
            return None
        if not isinstance(curve, dict):
            raise InputError(f"{source}: wake_curve must be an object with idle_us and extra_us")
        return cls(curve.get("idle_us") or [], curve.get("extra_us") or [], probs=curve.get("probs"),
                   extra_q_us=curve.get("extra_q_us"), source=f"{source}: wake_curve")

    @property
    def random(self) -> bool:
        """Whether :meth:`extra_ns` uses its draw (the curve carries quantiles)."""
        return self.probs is not None

    def extra_ns(self, idle_ns: int, u: float = 0.5) -> int:
        """Extra nanoseconds for a launch after ``idle_ns`` of idling (> 0); ``u`` in [0, 1)
        picks from the quantiles when the curve has them (else the mean is returned)."""
        x = math.log(max(idle_ns, 1) * 1e-3)
        lx = self._log_idle
        i = bisect.bisect_left(lx, x)
        if i == 0 or i == len(lx):
            return round(self._at(i - (i > 0), u) * 1e3)
        f = (x - lx[i - 1]) / (lx[i] - lx[i - 1])
        if self.probs is None:
            a, b = self.extra_us[i - 1], self.extra_us[i]
        else:
            # Both idle points at the same u: the quantile bracket is found once (as _at does).
            p, q0, q1 = self.probs, self.extra_q_us[i - 1], self.extra_q_us[i]
            j = min(max(bisect.bisect_right(p, u), 1), len(p) - 1)
            g = (u - p[j - 1]) / (p[j] - p[j - 1])
            a, b = q0[j - 1] + g * (q0[j] - q0[j - 1]), q1[j - 1] + g * (q1[j] - q1[j - 1])
        return round(((1.0 - f) * a + f * b) * 1e3)

    def _at(self, point: int, u: float) -> float:
        """Extra µs at one idle point: its mean, or its quantile function at u."""
        if self.probs is None:
            return self.extra_us[point]
        p, q = self.probs, self.extra_q_us[point]
        j = min(max(bisect.bisect_right(p, u), 1), len(p) - 1)
        g = (u - p[j - 1]) / (p[j] - p[j - 1])
        return q[j - 1] + g * (q[j] - q[j - 1])

    def describe(self) -> dict:
        out = {"idle_us": self.idle_us, "extra_us": self.extra_us}
        if self.probs is not None:
            out |= {"probs": self.probs, "extra_q_us": self.extra_q_us}
        return out
