"""The event-free loop of one instance under Triton's dynamic batcher, compiled.

``_Driver._run_queue_rule`` spends about 3.5 µs of Python a batch; 2,000,000 requests at 70%
load make 124,000 batches. Where the C extension is built (setup.py) and the run is its
common case, the loop runs in ``schedsim.core._queue_run`` instead, with the same answer bit
for bit: the dynamic batcher's queue rule, ``CostModel.sample_s``, the wake-up cost and the
power-capped clock restated in C, the same arithmetic in the same order. What only Python
has (a batch size's cost entry, which may raise as ``sample_s`` would; the next block of
uniform draws) it asks for when it reaches it, so a run draws exactly the numbers and builds
exactly the entries the Python loop does.

Covered: a :class:`~schedsim.cost.model.CostModel` itself (a subclass may price otherwise),
one sample and one seq_len per request, and a queue rule that says which compiled rule it is
(``rule.compiled_as``): ``("dynamic", preferred_batch_sizes, max_queue_delay_ns,
max_batch_size)``, set by ``DynamicBatcher.queue_rule`` and by ``NoBatching``'s (the dynamic
batcher's rule at size 1, no delay), or ``("static", batch_size, max_wait_ns)`` by
``StaticBatching``'s. Anything else, or no extension, runs the Python loop.
``tests/unit/core/test_compiled_queue.py`` runs both on random traces, settings and profiles
and requires equal results.
"""

from __future__ import annotations

import numpy as np

from schedsim.cost.model import CostModel, QUANTILE_POINTS

try:
    from schedsim.core import _queue_run
except ImportError:  # not built (no C compiler at install): the Python loop runs
    _queue_run = None

ENABLED = True
"""False: every run takes the Python loop (for comparing the two)."""

_DONE, _NEED_UNIFORMS, _NEED_WAKE_DRAWS, _NEED_SIZE = range(4)
(_HEAD, _TAIL, _NOW, _NEXT_ARRIVAL, _FREED, _CLOCK_AT, _CLOCK_BUSY_UNTIL, _LOG_LEN, _UPOS, _WPOS,
 _SIZE) = range(11)
_WAKE_CONST, _WAKE_CURVE, _WAKE_CURVE_RANDOM = range(3)
_RULES = {"dynamic": 0, "static": 1}
_BLOCK = 4096  # the first block of uniforms; later ones double, up to _MAX_BLOCK
_MAX_BLOCK = 1 << 20  # (a Generator's numbers are the same whatever blocks they are drawn in)


def available() -> bool:
    return _queue_run is not None and ENABLED


def covers(driver, rule) -> bool:
    """Whether this run can take the compiled loop (see the module docstring)."""
    return (available() and getattr(rule, "compiled_as", (None,))[0] in _RULES
            and type(driver.cost) is CostModel and driver.one_sample_each and driver.one_seq_len is not None
            and driver.uniforms is not driver.rng)


class _SizeTables:
    """Per batch size b = 0..most: each entry of ``CostModel._entry`` as arrays, filled on demand."""

    def __init__(self, cost: CostModel, most: int, seq_len: int, clock):
        size, k = most + 1, QUANTILE_POINTS
        self.cost, self.seq_len, self.clock = cost, seq_len, clock
        self.prepared = np.zeros(size, np.uint8)
        self.constant = np.zeros(size, np.uint8)
        self.has_q1 = np.zeros(size, np.uint8)
        self.value = np.zeros(size)
        self.weight = np.zeros(size)
        self.dispatch = np.zeros(size)
        self.steady = np.ones(size)
        self.table_factor = np.ones(size)
        self.q0 = np.zeros((size, k))
        self.q1 = np.zeros((size, k))

    def prepare(self, b: int) -> None:
        cost = self.cost
        e = cost._entries.get((b, self.seq_len))
        if e is None:
            e = cost._entry(b, self.seq_len)  # raises as sample_s would, for a size it cannot price
        _, constant, q0, q1, w = e
        if q0 is None:
            self.constant[b], self.value[b] = 1, constant
        else:
            self.q0[b] = q0
            if q1 is not None:
                self.q1[b], self.has_q1[b], self.weight[b] = q1, 1, w
        self.dispatch[b] = cost.dispatch_s(b)
        if self.clock is not None:
            self.steady[b], self.table_factor[b] = self.clock.cap.steady(b), self.clock.cap.table_factor(b)
        self.prepared[b] = 1


def run(driver, rule) -> None:
    """``driver._run_queue_rule(rule)``, compiled: fills ``driver.log`` and ``driver.delivered``."""
    kind, *settings = rule.compiled_as
    if kind == "dynamic":
        preferred, delay, most = settings
        max_preferred = preferred[-1]
    else:  # static: batch_size, max_wait_ns
        (most, delay), preferred, max_preferred = settings, (), 0
    arrival = np.ascontiguousarray(driver.arrival_ns, np.int64)
    cost, clock = driver.cost, driver.gpu_clock
    tables = _SizeTables(cost, most, driver.one_seq_len, clock)
    curve = cost.wake_curve
    if curve is None:
        wake_mode, wake_const = _WAKE_CONST, int(round(cost.wake_overhead_s * 1e9))
        log_idle = extra_us = probs = extra_q = np.zeros(0)
    else:
        wake_mode, wake_const = (_WAKE_CURVE_RANDOM if curve.random else _WAKE_CURVE), 0
        log_idle, extra_us = np.array(curve._log_idle, float), np.array(curve.extra_us, float)
        probs = np.array(curve.probs if curve.random else [], float)
        extra_q = np.array(curve.extra_q_us if curve.random else [], float).ravel()
    params = np.array([delay, most, max_preferred, clock is not None, wake_mode, wake_const, _RULES[kind]], np.int64)
    fparams = np.array([float(QUANTILE_POINTS - 1), clock._rise if clock else 1.0, clock._fall if clock else 1.0,
                        clock._idle if clock else 1.0])
    first = int(arrival[0])
    istate = np.array([0, 0, first, first, -1, clock.at_ns if clock else 0, clock.busy_until if clock else 0,
                       0, 0, 0, 0], np.int64)
    fstate = np.array([clock.factor if clock else 1.0, clock.busy_target if clock else 1.0])
    rng, wake_rng = driver.rng, driver.wake_rng
    uniforms = wake_draws = np.zeros(0)
    # A batch takes a row at least: room for one per row, of which only what is written is
    # ever touched (and so resident).
    log = np.empty(6 * len(arrival), np.int64)
    preferred = np.array(preferred, np.int64).reshape(-1)
    while True:
        code = _queue_run.run(arrival, preferred, tables.prepared, tables.constant, tables.has_q1, tables.value,
                              tables.q0, tables.q1, tables.weight, tables.dispatch, tables.steady,
                              tables.table_factor, uniforms, wake_draws, log_idle, extra_us, probs, extra_q,
                              params, fparams, istate, fstate, log, QUANTILE_POINTS)
        if code == _DONE:
            break
        if code == _NEED_SIZE:
            tables.prepare(int(istate[_SIZE]))
        elif code == _NEED_UNIFORMS:
            uniforms, istate[_UPOS] = rng.random(min(max(_BLOCK, 2 * len(uniforms)), _MAX_BLOCK)), 0
        elif code == _NEED_WAKE_DRAWS:
            wake_draws, istate[_WPOS] = wake_rng.random(min(max(_BLOCK, 2 * len(wake_draws)), _MAX_BLOCK)), 0
        else:  # 4, the log full: a batch takes a row at least, so the log has room for every one
            raise RuntimeError(f"compiled queue loop: unexpected code {code}")
    driver.log = log[:istate[_LOG_LEN]]  # the driver reads it as it reads its own array("q")
    driver.delivered = int(istate[_TAIL])
    if clock is not None:
        clock.factor, clock.busy_target = float(fstate[0]), float(fstate[1])
        clock.at_ns, clock.busy_until = int(istate[_CLOCK_AT]), int(istate[_CLOCK_BUSY_UNTIL])
