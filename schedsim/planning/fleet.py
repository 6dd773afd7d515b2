"""The fleet driver: a router in front of N replicas, each a simulate.py driver with its own
policy instance, on one shared event loop (and, optionally, an autoscaler).

A router needs each replica's state at every arrival, so requests are routed one by one
at their arrival time, after the completions of that instant and before any decision
(the ROUTE priority). A replica is the single-replica driver, told about its requests as
they are routed instead of all at once.

One wrinkle makes this a fixed point rather than one pass. A policy's ``reset`` sees its
whole request table before the run (the dynamic batcher precomputes deadlines and
priority levels from it), but which requests a replica gets is only known as the run
goes. So each pass gives every replica the table a guessed routing would give it (round
robin at first, then the routing of the previous pass), overwrites rows that the router
sends elsewhere, and runs. When a pass routes exactly as its guess, every policy was reset
with the table it really got: that pass is exact, and every replica's result equals
``simulate()`` on its own requests with its own seed (tests check this), except that a
replica learns the trace has ended only when the fleet's has (``_Replica.end_trace``).
Routing settles in the second pass; round robin, which ignores state, in the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from schedsim.core.events import COMPLETION, DECISION, EventLoop, Scheduled
from schedsim.core.policy import NEVER, Requests
from schedsim.core.results import SimResult
from schedsim.core.simulate import _Driver
from schedsim.errors import InputError
from schedsim.registry import build_policy, load_router

ROUTE = (COMPLETION + DECISION) / 2
"""Arrivals are routed (and the autoscaler looks) after completions, before decisions."""
REPLICA_SEED_STRIDE = 1_000_003
"""Replica r draws service times with seed ``seed + r * REPLICA_SEED_STRIDE`` (r=0: ``seed``)."""
MAX_PASSES = 12


class _Replica(_Driver):
    """A single-replica driver whose requests arrive as the router sends them."""

    def __init__(self, fleet: "_Fleet", index: int, table: Requests, policy, seed: int):
        super().__init__(table, policy, fleet.cost, fleet.instances, seed, False, fleet.env)
        self.fleet, self.index = fleet, index
        # Facts about every request of the trace hold for any subset of it; the guessed
        # table's own facts might not hold for the rows really routed here.
        self.one_sample_each, self.one_seq_len = fleet.one_sample_each, fleet.one_seq_len
        self.routed = 0                      # local rows [0, routed) have arrived
        self.global_rows = np.full(self.n, -1, dtype=np.int64)
        self.next_arrival_ns = NEVER
        self.started = self.finished = 0
        self.busy_ns = 0                     # instance time of finished batches
        self.running_since: dict[int, int] = {}
        self.trace_over = self.ended = False

    def begin(self) -> None:
        self.policy.reset(self.req, self.instances)
        if self.n:
            self._wake_at_arrival(0)

    def take(self, now: int, global_row: int) -> bool:
        """Request ``global_row`` arrives here now; False if the guessed table has no room."""
        k = self.routed
        if k >= self.n:
            return False
        f = self.fleet.requests
        for col in ("arrival_ns", "samples", "seq_len", "priority", "timeout_ns",
                    "input_tokens", "output_tokens"):
            getattr(self.req, col)[k] = getattr(f, col)[global_row]
        self.cum_samples[k + 1] = self.cum_samples[k] + self.req.samples[k]
        self.global_rows[k] = global_row
        self.routed = k + 1
        if self.next_arrival_ns == NEVER:
            self.next_arrival_ns = now
        if self.arrival_wake == k:
            Scheduled(self.env, 0, DECISION, self._on_decision_event)
        return True

    def end_trace(self, now: int) -> None:
        """No request will come any more: the fleet's trace has ended. A replica cannot know
        earlier that its own last request has come, as the router decides as it goes; so
        a policy that acts on the end of the trace (a static batcher's remainder) does so
        here, not at the replica's last arrival as it would when simulated alone."""
        self.trace_over = True
        self.dirty = True
        Scheduled(self.env, 0, DECISION, self._on_decision_event)

    # --- the single-replica driver's hooks, bounded by what has been routed ---------------

    def _wake_at_arrival(self, row: int) -> None:
        # No "the last arrival ends the trace" wake-up as in the single driver: see end_trace.
        if row < self.delivered or row == self.arrival_wake:
            return
        self.arrival_wake = row
        if row < self.routed:  # already here: decide at once (after this instant's completions)
            Scheduled(self.env, 0, DECISION, self._on_decision_event)

    def _deliver(self, now: int) -> None:
        if self.routed > self.delivered:
            first, self.delivered = self.delivered, self.routed
            self.next_arrival_ns = NEVER
            self.policy.on_arrivals(now, first, self.routed)
            self.dirty = True

    def _decide_now(self, now: int) -> None:
        self._deliver(now)
        if self.trace_over and not self.ended:
            self.ended = True
            self.policy.on_trace_end(now)
            self.dirty = True
        super()._decide_now(now)

    def _launch(self, now: int, launch) -> None:
        super()._launch(now, launch)
        count = self.last_count
        self.started += count
        self.running_since[launch.instance] = now
        self.fleet.on_start(now, self.index, count)

    def _on_completion(self, event) -> None:
        instance, rows = event.value
        now = self.env.now
        count = len(rows)
        self.finished += count
        self.busy_ns += now - self.running_since.pop(instance)
        self.fleet.on_done(now, self.index, count)
        super()._on_completion(event)

    def busy_until(self, now: int) -> int:
        """Instance time spent on batches up to ``now`` (running ones count so far)."""
        return self.busy_ns + sum(now - t for t in self.running_since.values())


@dataclass
class FleetResult:
    """The merged per-request table (instances numbered replica-major) and per-replica parts."""

    result: SimResult
    replica: np.ndarray
    """Replica of each request (the routing)."""
    replica_results: list
    passes: int
    scaling_log: list = field(default_factory=list)
    """(time_ns, action, replica, active count) from the autoscaler."""
    gpu_ns: int = 0
    """Replica time paid for: from launch (cold start included) to removal and drain."""


class _Fleet:
    def __init__(self, requests, make_policy, cost, replicas, instances, seed, router, guess,
                 autoscaler=None, initial=None, slack=0):
        self.requests, self.cost, self.instances = requests, cost, instances
        self.router, self.autoscaler = router, autoscaler
        self.env = EventLoop()
        n = len(requests)
        self.n = n
        self.one_sample_each = bool(n == 0 or (requests.samples == 1).all())
        seq = requests.seq_len
        self.one_seq_len = int(seq[0]) if n and (seq == seq[0]).all() else None
        self.assign = np.full(n, -1, dtype=np.int64)
        self.overflow = False
        self.replicas = []
        for r in range(replicas):
            rows = np.flatnonzero(guess == r)
            if slack:  # room for more requests than guessed; the rows are placeholders
                rows = np.concatenate([rows, np.arange(min(n, max(slack, rows.size // 4)))])
            table = Requests(*(np.array(getattr(requests, c)[rows]) for c in _COLUMNS))
            self.replicas.append(_Replica(self, r, table, make_policy(), seed + r * REPLICA_SEED_STRIDE))
        self.active = list(range(replicas if initial is None else initial))
        self.scaling = None
        if autoscaler is not None:
            self.scaling = Scaling(self, autoscaler)

    def run(self):
        self.router.reset(self.requests, len(self.replicas))
        for replica in self.replicas:
            replica.begin()
        if self.n:
            Scheduled(self.env, int(self.requests.arrival_ns[0]), ROUTE, self._on_arrival, 0)
        else:
            for replica in self.replicas:
                replica.end_trace(0)
        if self.scaling is not None:
            self.scaling.start()
        self.env.run()

    def _on_arrival(self, event) -> None:
        g, now = event.value, self.env.now
        arrival = self.requests.arrival_ns
        while True:  # every request arriving at this instant, in order
            r = self.router.route(now, g, list(self.active))
            if r not in self.active:
                raise RuntimeError(f"{type(self.router).__name__}.route returned {r}, not an active replica")
            self.assign[g] = r
            if not self.replicas[r].take(now, g):
                self.overflow = True
                self.router.on_start(now, r, 1)   # keep the router's counts consistent
                self.router.on_done(now, r, 1)
            g += 1
            if g >= self.n or arrival[g] != now:
                break
        if g < self.n:
            Scheduled(self.env, int(arrival[g]) - now, ROUTE, self._on_arrival, g)
        else:
            for replica in self.replicas:
                replica.end_trace(now)

    def on_start(self, now, r, count):
        self.router.on_start(now, r, count)

    def on_done(self, now, r, count):
        self.router.on_done(now, r, count)
        if self.scaling is not None:
            self.scaling.on_done(now, r)

    def outstanding(self) -> int:
        return sum(rep.routed - rep.finished for rep in self.replicas)


_COLUMNS = ("arrival_ns", "samples", "seq_len", "priority", "timeout_ns", "input_tokens", "output_tokens")


def simulate_fleet(requests: Requests, make_policy, cost, *, replicas: int, router, instances: int = 1,
                   seed: int = 0, autoscaler=None, initial_replicas: int | None = None,
                   make_router=None) -> FleetResult:
    """Replay ``requests`` through ``router`` onto ``replicas`` replicas, each running a fresh
    ``make_policy()`` on ``instances`` instances. With an ``autoscaler``, ``replicas`` is the
    most there can be and ``initial_replicas`` start active. ``make_router`` (default: a
    copy of ``router``'s class and attributes) gives each pass a fresh router."""
    if replicas < 1:
        raise InputError(f"--replicas: {replicas} is not valid; expected an integer >= 1")
    n = len(requests)
    initial = replicas if initial_replicas is None else initial_replicas
    if getattr(requests, "hash_ids", None) is not None:
        raise InputError("--replicas: traces with prefix hash ids are not supported by the fleet driver yet")
    guess = np.arange(n, dtype=np.int64) % max(initial, 1)
    make_router = make_router or (lambda: _fresh(router))
    # Passes alternate: a padded one (tables longer than guessed, so no request finds its
    # replica's table full) finds the routing; an exact one (tables exactly as that routing
    # gives them) checks it. A router that ignores state starts with the exact check.
    padded = not (getattr(router, "stateless", False) and autoscaler is None)
    for passes in range(1, MAX_PASSES + 1):
        fleet = _Fleet(requests, make_policy, cost, replicas, instances, seed, make_router(), guess,
                       autoscaler() if autoscaler else None, initial, slack=1024 if padded else 0)
        fleet.run()
        if not padded and not fleet.overflow and np.array_equal(fleet.assign, guess):
            return _merge(fleet, passes)
        guess, padded = fleet.assign, not padded
    raise RuntimeError(f"fleet: the routing did not settle in {MAX_PASSES} passes "
                       "(a policy whose decisions depend on requests it has not been sent?)")


class Scaling:
    """The autoscaler's measurements, actions, log and bill inside one fleet run."""

    def __init__(self, fleet, autoscaler):
        """``autoscaler``: a :class:`~schedsim.planning.autoscale.UtilizationAutoscaler` (or
        anything with its ``interval_s``, ``cold_start_s``, ``reset()`` and ``decide()``)."""
        self.fleet, self.auto = fleet, autoscaler
        autoscaler.reset()
        self.interval_ns = int(round(autoscaler.interval_s * 1e9))
        self.cold_ns = int(round(autoscaler.cold_start_s * 1e9))
        self.starting: set[int] = set()
        self.draining: set[int] = set()
        first = int(fleet.requests.arrival_ns[0]) if fleet.n else 0
        self.paid: dict[int, list] = {r: [[first, None]] for r in fleet.active}  # replica -> [[from, to]]
        self.log: list[tuple] = []
        self.last_busy = 0

    def start(self) -> None:
        Scheduled(self.fleet.env, self.interval_ns, ROUTE, self._tick)

    def _busy(self, now: int) -> int:
        return sum(self.fleet.replicas[r].busy_until(now) for r in self.fleet.active)

    def _tick(self, _event) -> None:
        fleet, now = self.fleet, self.fleet.env.now
        busy = self._busy(now)
        capacity = len(fleet.active) * fleet.instances * self.interval_ns
        util = min(1.0, max(0.0, (busy - self.last_busy) / capacity)) if capacity else 0.0
        step = self.auto.decide(now, util, len(fleet.active), len(self.starting))
        if step > 0:
            r = min(set(range(len(fleet.replicas))) - set(fleet.active) - self.starting)
            self.starting.add(r)
            self.draining.discard(r)
            self.paid.setdefault(r, []).append([now, None])
            self.log.append((now, "launch", r, len(fleet.active)))
            Scheduled(fleet.env, self.cold_ns, ROUTE, self._ready, r)
        elif step < 0:
            r = fleet.active[-1]
            fleet.active.remove(r)
            self.log.append((now, "remove", r, len(fleet.active)))
            self._drained_or_wait(now, r)
        # Busy time of the replicas active from now on, so the next sample is theirs alone.
        self.last_busy = self._busy(now)
        if (fleet.n and fleet.assign[-1] < 0) or fleet.outstanding() or self.starting:
            Scheduled(fleet.env, self.interval_ns, ROUTE, self._tick)

    def _ready(self, event) -> None:
        r, now = event.value, self.fleet.env.now
        self.starting.discard(r)
        busy_before = self.fleet.replicas[r].busy_until(now)
        self.fleet.active = sorted(self.fleet.active + [r])
        self.last_busy += busy_before  # it joins the measured set with its past excluded
        self.log.append((now, "ready", r, len(self.fleet.active)))

    def _drained_or_wait(self, now: int, r: int) -> None:
        rep = self.fleet.replicas[r]
        if rep.routed - rep.finished == 0:
            self.paid[r][-1][1] = now
        else:
            self.draining.add(r)

    def on_done(self, now: int, r: int) -> None:
        if r in self.draining:
            rep = self.fleet.replicas[r]
            if rep.routed - rep.finished == 0:
                self.draining.discard(r)
                self.paid[r][-1][1] = now

    def gpu_ns(self, end_ns: int) -> int:
        return sum(min(end_ns if to is None else to, end_ns) - start
                   for spans in self.paid.values() for start, to in spans if start < end_ns)


def _fresh(obj):
    new = object.__new__(type(obj))
    new.__dict__.update({k: v for k, v in vars(obj).items()})
    return new


def _merge(fleet: _Fleet, passes: int) -> FleetResult:
    """One SimResult over the whole trace: instance ``r * instances + i`` is replica r's i-th."""
    req, n, k = fleet.requests, fleet.n, fleet.instances
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    size = np.zeros(n, np.int32)
    inst = np.full(n, -1, np.int16)
    status = np.zeros(n, np.int8)
    parts, logs = [], []
    for rep in fleet.replicas:
        res = rep._result()
        parts.append(res)
        g = rep.global_rows
        start[g], end[g], size[g], status[g] = res.start_ns, res.end_ns, res.batch_size, res.status
        inst[g] = np.where(res.instance >= 0, res.instance + rep.index * k, -1)
        logs.append((res.batch_start_ns, res.batch_end_ns, res.batch_instance.astype(np.int64) + rep.index * k,
                     res.batch_samples, res.batch_requests))
    cols = [np.concatenate(c) for c in zip(*logs)]
    order = np.lexsort((cols[2], cols[0]))  # by start time, then instance: a fixed order
    merged = SimResult(req, start, end, size, inst, status, cols[0][order], cols[1][order],
                       cols[2][order].astype(np.int16), cols[3][order].astype(np.int32),
                       cols[4][order].astype(np.int32), len(fleet.replicas) * k, parts[0].seed if parts else 0)
    scaling = fleet.scaling
    end_ns = int(max(merged.batch_end_ns.max(initial=0), req.arrival_ns.max(initial=0)))
    gpu_ns = scaling.gpu_ns(end_ns) if scaling else len(fleet.replicas) * (end_ns - int(req.arrival_ns.min(initial=0)))
    return FleetResult(merged, fleet.assign.copy(), parts, passes,
                       scaling.log if scaling else [], gpu_ns)


def local_requests(requests: Requests, rows: np.ndarray) -> Requests:
    """The table of ``rows`` alone, as one replica sees it (for checking a fleet run)."""
    return replace(requests, **{c: np.array(getattr(requests, c)[rows]) for c in _COLUMNS})


def simulate_spec_fleet(spec, inputs, cost, seed: int) -> SimResult:
    """``schedsim run --replicas N --router R``: the merged table of one fleet run."""
    router = load_router(spec.router)
    return simulate_fleet(inputs.requests, lambda: build_policy(spec.policy, inputs.params), cost,
                          replicas=spec.replicas, router=router, instances=inputs.instances,
                          seed=seed).result
