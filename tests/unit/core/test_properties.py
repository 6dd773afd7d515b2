"""Properties of every run, checked with hypothesis on small random traces and configs.

- every request ends exactly once (one launch or one reject in the decision log), and
  nothing is left unfinished (static flushes at trace end);
- no batch over the limit; dynamic never mixes seq_len in a batch;
- no instance runs two batches at once;
- dynamic, without priorities or timeouts: a request never waits past the queue delay
  while some instance is idle throughout;
- queue-full rejects happen exactly when the level's queue is full;
- a fixed seed repeats bit for bit; another seed differs when the cost is random;
- dynamic without timeouts is FIFO within a priority level;
- DynamicBatcher._form agrees with a literal transcription of Triton's GetDynamicBatch.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.core.policy import REJECT_QUEUE_FULL, REJECT_TIMEOUT, Requests
from schedsim.core.results import COMPLETED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace

PROPS = settings(max_examples=150, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class ExpCost:
    """Random service: exponential, mean 0.2 ms + 0.1 ms per sample (+ a seq_len term)."""

    random = True

    def sample_s(self, samples, seq_len, rng):
        return rng.exponential(2e-4 + 1e-4 * samples + 1e-6 * seq_len)


class FixedCost:
    random = False

    def __init__(self, ms):
        self.ms = ms

    def sample_s(self, samples, seq_len, rng):
        return self.ms * (1 + 0.25 * samples) / 1e3


# --- strategies ----------------------------------------------------------------------------

GAPS_US = [0, 0, 10, 50, 100, 250, 400, 1000, 3000]
# Add 200 and 1000 once StaticBatching stops asking to wake in the past
# (test_static_max_wait_wake_in_the_past below); with them these properties crash.
STATIC_MAX_WAIT_US = [0, 200, 1000]


@st.composite
def traces(draw, max_samples=4, priority_levels=0):
    n = draw(st.integers(1, 24))
    gaps = draw(st.lists(st.sampled_from(GAPS_US), min_size=n, max_size=n))
    batch = draw(st.lists(st.integers(1, max_samples), min_size=n, max_size=n))
    seq_len = draw(st.lists(st.sampled_from([32, 64, 128]), min_size=n, max_size=n))
    priority = draw(st.lists(st.integers(0, priority_levels), min_size=n, max_size=n))
    timeout_us = draw(st.lists(st.sampled_from([0, 0, 150, 600, 2000]), min_size=n, max_size=n))
    trace = Trace.from_arrivals(np.cumsum(gaps) / 1e6, batch=batch, seq_len=seq_len,
                                priority=priority, timeout_us=timeout_us)
    return Requests.from_trace(trace)


@st.composite
def dynamic_configs(draw, queue_policies=True, priorities=True):
    max_bs = draw(st.integers(4, 10))
    cfg = dict(
        max_batch_size=max_bs,
        preferred_batch_sizes=draw(st.lists(st.integers(1, max_bs), max_size=3)),
        max_queue_delay_us=draw(st.sampled_from([0, 100, 500, 2000])),
        prefetch=draw(st.booleans()),
    )
    if priorities:
        levels = draw(st.integers(0, 2))
        cfg.update(priority_levels=levels,
                   default_priority_level=draw(st.integers(1, levels)) if levels else 0)
    if queue_policies:
        cfg.update(max_queue_size=draw(st.sampled_from([0, 0, 1, 3, 5])),
                   default_timeout_us=draw(st.sampled_from([0, 0, 300, 1000])),
                   timeout_action=draw(st.sampled_from(["REJECT", "DELAY"])),
                   allow_timeout_override=draw(st.booleans()),
                   preserve_ordering=draw(st.booleans()))
    return cfg


@st.composite
def scenarios(draw):
    """(requests, policy factory, policy kind, instances, cost)."""
    kind = draw(st.sampled_from(["none", "static", "dynamic", "dynamic"]))
    if kind == "dynamic":
        cfg = draw(dynamic_configs())
        make = lambda: DynamicBatcher(**cfg)  # noqa: E731
        req = draw(traces(priority_levels=cfg["priority_levels"]))
    elif kind == "static":
        bs, wait = draw(st.integers(1, 5)), draw(st.sampled_from(STATIC_MAX_WAIT_US))
        make = lambda: StaticBatching(batch_size=bs, max_wait_us=wait)  # noqa: E731
        req = draw(traces())
    else:
        make, req = NoBatching, draw(traces())
    cost = draw(st.sampled_from([ExpCost(), FixedCost(0.3), FixedCost(1.0)]))
    return req, make, kind, draw(st.integers(1, 3)), cost


def run(req, make, instances, cost, seed=0):
    policy = make()
    return policy, simulate(req, policy, cost, instances=instances, seed=seed, record=True)


# --- every request ends exactly once -------------------------------------------------------

@PROPS
@given(scenarios())
def test_every_request_ends_exactly_once(scenario):
    req, make, kind, instances, cost = scenario
    _, res = run(req, make, instances, cost)
    n = len(req)
    seen = np.zeros(n, dtype=np.int64)
    launched = np.zeros(n, dtype=bool)
    reason = np.full(n, "", dtype=object)
    for _, what, _, rows in res.decisions:
        rows = np.asarray(rows, dtype=np.int64)
        seen[rows] += 1
        if what == "launch":
            launched[rows] = True
        else:
            reason[rows] = what
    assert (seen == 1).all(), seen  # never twice, never lost
    assert (res.status[launched] == COMPLETED).all()
    assert (res.status[reason == REJECT_QUEUE_FULL] == REJECTED_QUEUE_FULL).all()
    assert (res.status[reason == REJECT_TIMEOUT] == REJECTED_TIMEOUT).all()
    assert (res.end_ns >= req.arrival_ns).all()  # everything finished
    assert ((res.start_ns >= req.arrival_ns) == launched).all()
    if kind != "dynamic":
        assert launched.all()
    # The batch log and the per-request table tell the same story.
    assert res.batch_requests.sum() == launched.sum()
    assert res.batch_samples.sum() == req.samples[launched].sum()


# --- batch limits and instances ------------------------------------------------------------

@PROPS
@given(scenarios())
def test_batches_respect_limits_and_instances_never_overlap(scenario):
    req, make, kind, instances, cost = scenario
    policy, res = run(req, make, instances, cost)
    for _, what, _, rows in res.decisions:
        if what != "launch":
            continue
        rows = list(rows)
        if kind == "none":
            assert len(rows) == 1
        elif kind == "static":
            assert len(rows) <= policy.batch_size
            assert rows == list(range(rows[0], rows[0] + len(rows)))  # consecutive, in order
        else:
            assert req.samples[rows].sum() <= policy.max_batch_size
            assert len(set(req.seq_len[rows].tolist())) == 1, rows
    assert ((res.batch_instance >= 0) & (res.batch_instance < instances)).all()
    for inst in range(instances):
        mine = res.batch_instance == inst
        order = np.argsort(res.batch_start_ns[mine], kind="stable")
        start, end = res.batch_start_ns[mine][order], res.batch_end_ns[mine][order]
        assert (start[1:] >= end[:-1]).all()


def test_prefetch_never_mixes_seq_len_in_a_growing_batch():
    # Found by the property above (fixed). Row 1 (seq_len 32) is formed into a prefetched
    # batch while instance 0 is busy and the batch stays open; row 2 (seq_len 64) must not
    # join it: Triton's HasEqualInputs compares with the payload's shape.
    req = Requests.from_trace(Trace.from_arrivals([0.0, 1e-4, 2e-4], seq_len=[32, 32, 64]))
    res = simulate(req, DynamicBatcher(max_batch_size=4, prefetch=True), FixedCost(1.0),
                   record=True)
    batches = [rows for _, what, _, rows in res.decisions if what == "launch"]
    for rows in batches:
        assert len(set(req.seq_len[list(rows)].tolist())) == 1, batches


def test_static_max_wait_wake_in_the_past():
    # Found by the properties above with max_wait_us > 0 (fixed). Two requests at t=0,
    # batch_size 1, max_wait 200 us, service 1.25 ms: row 0 runs; at t=200 us the timer
    # fires with nothing idle; the policy must not ask to wake at 200 us = now again.
    req = Requests.from_trace(Trace.from_arrivals([0.0, 0.0]))
    res = simulate(req, StaticBatching(batch_size=1, max_wait_us=200), FixedCost(1.0))
    assert (res.status == COMPLETED).all()


# --- queue delay: no waiting past it while an instance is idle ----------------------------

@PROPS
@given(st.data())
def test_dynamic_never_waits_past_the_delay_while_an_instance_is_idle(data):
    cfg = data.draw(dynamic_configs(queue_policies=False, priorities=False))
    req = data.draw(traces())
    instances = data.draw(st.integers(1, 3))
    cost = data.draw(st.sampled_from([ExpCost(), FixedCost(0.3), FixedCost(2.0)]))
    _, res = run(req, lambda: DynamicBatcher(**cfg), instances, cost)
    delay = cfg["max_queue_delay_us"] * 1000
    for r in range(len(req)):
        a = int(req.arrival_ns[r])
        # An instance is idle throughout [a, a + delay] when none of its batches starts
        # by a + delay and ends after a.
        busy = (res.batch_start_ns <= a + delay) & (res.batch_end_ns > a)
        idle_throughout = set(range(instances)) - set(res.batch_instance[busy].tolist())
        if idle_throughout:
            assert res.start_ns[r] <= a + delay, (r, idle_throughout)


# --- queue-full rejects ----------------------------------------------------------------------

@PROPS
@given(st.data())
def test_queue_full_rejects_only_when_that_many_are_queued(data):
    cfg = data.draw(dynamic_configs())
    cfg["max_queue_size"] = data.draw(st.integers(1, 4))
    req = data.draw(traces(priority_levels=cfg["priority_levels"]))
    instances = data.draw(st.integers(1, 2))
    policy, res = run(req, lambda: DynamicBatcher(**cfg), instances, FixedCost(1.0))
    levels = policy.priority_levels
    level = np.where(req.priority == 0, policy.default_priority_level, req.priority) if levels \
        else np.zeros(len(req), dtype=np.int64)
    full = res.status == REJECTED_QUEUE_FULL
    # When a row is admitted, the queue holds the earlier rows of its level that were
    # admitted and have not left yet. Within one instant arrivals are admitted before any
    # launch or timeout, so a row leaving at the same instant still counts. With prefetch,
    # rows moved into a formed batch left the queue before their launch: the count is an
    # upper bound, and both implications below still hold.
    left = np.where(res.start_ns >= 0, res.start_ns, res.end_ns)
    for r in range(len(req)):
        a = req.arrival_ns[r]
        earlier = np.arange(r)
        queued = ((level[earlier] == level[r]) & ~full[earlier] & (left[earlier] >= a)).sum()
        if full[r]:
            assert queued >= cfg["max_queue_size"], r
            assert res.end_ns[r] == a  # a full queue rejects at once
        elif not cfg["prefetch"]:
            assert queued < cfg["max_queue_size"], r
        if queued < cfg["max_queue_size"]:
            assert not full[r], r


def test_queue_full_reject_is_stamped_at_arrival():
    req = Requests.from_trace(Trace.from_arrivals([0.0, 1e-5, 1e-5]))
    res = simulate(req, DynamicBatcher(max_batch_size=4, max_queue_size=1), FixedCost(1.0),
                   record=True)
    assert res.status[2] == REJECTED_QUEUE_FULL
    assert res.end_ns[2] == req.arrival_ns[2]  # was 1.25 ms (when row 0 completed) before the fix


# --- determinism -------------------------------------------------------------------------

COLUMNS = ("start_ns", "end_ns", "batch_size", "instance", "status", "batch_start_ns",
           "batch_end_ns", "batch_instance", "batch_samples", "batch_requests")


@PROPS
@given(scenarios(), st.integers(0, 2 ** 32))
def test_same_seed_same_result_and_another_seed_differs(scenario, seed):
    req, make, _, instances, cost = scenario
    _, a = run(req, make, instances, cost, seed=seed)
    _, b = run(req, make, instances, cost, seed=seed)
    for col in COLUMNS:
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), col
    assert a.decisions == b.decisions
    if cost.random and a.batch_start_ns.size:
        _, c = run(req, make, instances, cost, seed=seed + 1)
        first = a.batch_end_ns - a.batch_start_ns, c.batch_end_ns - c.batch_start_ns
        assert first[0][0] != first[1][0]  # the first batch is the same; its draw is not


# --- FIFO within a priority level --------------------------------------------------------

@PROPS
@given(st.data())
def test_dynamic_without_timeouts_is_fifo_within_a_level(data):
    cfg = data.draw(dynamic_configs())
    cfg.update(default_timeout_us=0, allow_timeout_override=False)
    req = data.draw(traces(priority_levels=cfg["priority_levels"]))
    policy, res = run(req, lambda: DynamicBatcher(**cfg), data.draw(st.integers(1, 3)),
                      data.draw(st.sampled_from([ExpCost(), FixedCost(0.5)])))
    assert not (res.status == REJECTED_TIMEOUT).any()
    level = np.where(req.priority == 0, policy.default_priority_level, req.priority) \
        if policy.priority_levels else np.zeros(len(req), dtype=np.int64)
    served = res.status == COMPLETED
    for lv in np.unique(level):
        start = res.start_ns[served & (level == lv)]  # rows are in arrival order
        assert (np.diff(start) >= 0).all(), (lv, start)


# --- the Triton walk: an oracle ------------------------------------------------------------

def triton_get_dynamic_batch(queue, payload, payload_seq_len, age_ns, delay_ns, max_batch_size,
                             preferred_batch_sizes):
    """GetDynamicBatch (triton-inference-server/core, src/dynamic_batch_scheduler.cc), by hand.

    ``queue``: the queued requests in walk order, as (samples, seq_len); ``payload``:
    samples already in the current (prefetched, still open) payload, whose requests have
    ``payload_seq_len``; ``age_ns``: how long the oldest queued request has waited.
    Returns (requests to move into the payload now, payload_saturated_ afterwards) and
    the quirks of Triton's code that the case went through.
    """
    preferred = set(preferred_batch_sizes) or {max_batch_size}  # model_config_utils.cc
    max_preferred = max(preferred)
    payload_saturated = False   # payload_saturated_, as NewPayload() leaves it
    send_now = False
    best = 0                    # best_preferred_batch_size, in samples
    mark = 0                    # queue_.MarkCursor(): requests before the mark
    pending = 0                 # pending_batch_size_, in samples
    count = 0                   # queue_.PendingBatchCount(), in requests
    shape = payload_seq_len if payload else None
    quirks = set()
    for samples, seq_len in queue:
        batch_size = max(1, samples)
        if payload + count == 0:
            shape = seq_len      # RequiredEqualInputs::Initialize
        else:
            if payload + pending + batch_size > max_preferred and best == 0:
                if pending == 0:
                    quirks.add("mark-at-zero")  # best stays 0 and is set again below
                elif "mark-at-zero" in quirks:
                    quirks.add("re-marked")
                best = pending
                mark = count
                payload_saturated = True
            if payload + pending + batch_size > max_batch_size:
                send_now = True
                break
            if seq_len != shape:   # !HasEqualInputs: MarkSaturated(), send the pending batch
                send_now = True
                break
        pending += batch_size
        count += 1
        if payload + pending in preferred:
            best = pending
            mark = count
    delay_is_exceeded = delay_ns != 0 and age_ns >= delay_ns
    if best != 0 and not delay_is_exceeded:
        if delay_ns == 0:
            payload_saturated = True
        elif not payload_saturated:
            quirks.add("preferred-stays-open")
        return (mark, payload_saturated), quirks
    if count == 0:
        return (0, payload_saturated), quirks
    if send_now or payload + pending >= max_preferred:
        return (count, True), quirks
    if delay_is_exceeded or delay_ns == 0:
        return (count, payload_saturated), quirks
    if not payload_saturated and payload != 0 and payload not in preferred:
        return (count, payload_saturated), quirks
    return (0, payload_saturated), quirks


@st.composite
def walk_cases(draw, unit):
    max_bs = draw(st.integers(1, 10))
    preferred = draw(st.lists(st.integers(1, max_bs), max_size=3))
    n = draw(st.integers(1, 14))
    if unit:
        samples, seq_len = [1] * n, [64] * n
    else:
        samples = draw(st.lists(st.integers(1, min(4, max_bs)), min_size=n, max_size=n))
        seq_len = draw(st.lists(st.sampled_from([32, 64]), min_size=n, max_size=n))
    # An open payload holds fewer samples than the largest preferred size (a larger one
    # is saturated in both Triton and schedsim); 0 = no payload (prefetch off).
    max_preferred = max(preferred, default=max_bs)
    payload = draw(st.one_of(st.just(0), st.integers(0, max_preferred - 1)))
    delay_us = draw(st.sampled_from([0, 100, 1000]))
    age_us = draw(st.sampled_from([0, 50, 99, 100, 999, 1000, 5000]))
    gaps_us = draw(st.lists(st.sampled_from([0, 1, 30]), min_size=n - 1, max_size=n - 1))
    return max_bs, preferred, delay_us, samples, seq_len, payload, age_us, gaps_us


def form_vs_oracle(case):
    max_bs, preferred, delay_us, samples, seq_len, payload, age_us, gaps_us = case
    arrival_us = np.concatenate([[0], np.cumsum(gaps_us)])
    req = Requests.from_trace(Trace.from_arrivals(arrival_us / 1e6, batch=samples,
                                                  seq_len=seq_len))
    policy = DynamicBatcher(max_batch_size=max_bs, preferred_batch_sizes=preferred,
                            max_queue_delay_us=delay_us)
    policy.reset(req, 1)
    now = int(req.arrival_ns[-1])
    policy.on_arrivals(now, 0, len(req))
    now = int(req.arrival_ns[0]) + age_us * 1000  # the head has waited age_us
    now = max(now, int(req.arrival_ns[-1]))
    take, wake, saturated = policy._form(now, payload, seq_len[0])
    expected, quirks = triton_get_dynamic_batch(
        list(zip(samples, seq_len)), payload, seq_len[0], now - int(req.arrival_ns[0]),
        delay_us * 1000, max_bs, preferred)
    if take == 0 and not expected[0] and wake != np.iinfo(np.int64).max:
        assert wake == int(req.arrival_ns[0]) + delay_us * 1000  # wait for the head's delay
    return policy, (take, saturated), expected, quirks


def assert_agrees(policy, got, expected, quirks):
    assert got[0] == expected[0], (got, expected, quirks)
    if expected[0]:  # nothing taken: whether the blocked payload is closed does not matter
        assert got[1] == expected[1], (got, expected, quirks)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(walk_cases(unit=True))
def test_form_closed_form_walk_matches_triton(case):
    policy, got, expected, quirks = form_vs_oracle(case)
    assert policy._unit
    assert_agrees(policy, got, expected, quirks)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(walk_cases(unit=False))
def test_form_vector_walk_matches_triton(case):
    policy, got, expected, quirks = form_vs_oracle(case)
    assert_agrees(policy, got, expected, quirks)


def test_oracle_is_the_documented_walk():
    # Spot checks of the transcription on the rules in docs: preferred hit, pass the
    # largest preferred size, max_batch_size, shape change, delay expired, wait.
    o = lambda q, **k: triton_get_dynamic_batch(q, k.get("payload", 0), 64, k.get("age", 0),  # noqa: E731
                                                k.get("delay", 1000), k.get("mbs", 8),
                                                k.get("pref", [2, 4]))[0]
    assert o([(1, 64)] * 3) == (2, False)                   # preferred 2, delay not expired
    assert o([(1, 64)] * 3, delay=0) == (2, True)
    assert o([(3, 64), (3, 64)]) == (1, True)               # 3 + 3 passes 4: best = 3
    # Hits max_batch_size; 8 is the (default) preferred size, so with a delay Triton leaves
    # payload_saturated_ unset (the next walk finds the payload full and sets it).
    assert o([(1, 64)] * 9, pref=[]) == (8, False)
    assert o([(1, 64)] * 9, pref=[], delay=0) == (8, True)
    assert o([(2, 64)] * 3, pref=[3]) == (1, True)           # 2 + 2 passes 3: best = 2
    assert o([(1, 64), (1, 32)], pref=[]) == (1, True)      # shape change: send now
    assert o([(1, 64)], pref=[], age=1000) == (1, False)    # delay expired
    assert o([(1, 64)], pref=[]) == (0, False)              # wait


def test_form_rearms_best_after_a_first_request_that_passes_the_largest_preferred_size():
    # Open payload of 1 sample, preferred [2], queue [2, 3] samples, delay 0. Triton: the
    # first request passes 2 with pending 0, so best = 0 ("none") and the walk goes on;
    # the second request passes it again and best becomes 2 samples = 1 request.
    # (schedsim took both before this was fixed.)
    # schedsim takes both (6 samples).
    case = (10, [2], 0, [2, 3], [32, 32], 1, 50, [0])
    policy, got, expected, quirks = form_vs_oracle(case)
    assert expected == (1, True) and "re-marked" in quirks
    assert got[0] == expected[0]


def test_form_preferred_size_payload_stays_open_with_a_delay():
    # preferred [2, 4], delay 1 ms, two queued: Triton sends 2 but does not set
    # payload_saturated_, so with prefetch the payload grows to 4 if two more arrive
    # before an instance takes it. (schedsim closed it before this was fixed.)
    case = (8, [2, 4], 1000, [1, 1], [64, 64], 0, 0, [0])
    policy, got, expected, quirks = form_vs_oracle(case)
    assert expected == (2, False)
    assert got == expected


# --- the driver's shortcuts change nothing ------------------------------------------------------

class AlwaysAwake:
    """Wraps a policy and asks the driver to wake it at every arrival: no bulk delivery,
    no skipped arrivals. Any policy must give the same result either way."""

    def __init__(self, inner):
        self.inner = inner
        self.preserve_ordering = getattr(inner, "preserve_ordering", False)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, now_ns, idle):
        d = self.inner.decide(now_ns, idle)
        d.wake_on_arrival, d.arrivals_needed = True, 1
        return d


COLUMNS_COMPARED = ("start_ns", "end_ns", "batch_size", "instance", "status")


@PROPS
@given(scenarios(), st.integers(0, 3))
def test_bulk_arrivals_and_skipped_wakeups_give_the_same_result(scenario, seed):
    req, make, kind, instances, cost = scenario
    _, lazy = run(req, make, instances, cost, seed)
    _, eager = run(req, lambda: AlwaysAwake(make()), instances, cost, seed)
    assert lazy.decisions == eager.decisions
    for name in COLUMNS_COMPARED:
        assert np.array_equal(getattr(lazy, name), getattr(eager, name)), name


@PROPS
@given(traces(max_samples=1), dynamic_configs(queue_policies=False, priorities=False),
       st.integers(1, 3), st.booleans())
def test_dynamic_fast_path_matches_the_general_path(req, cfg, instances, one_seq_len):
    if one_seq_len:
        req = Requests(req.arrival_ns, req.samples, np.full(len(req), 64, np.int32), req.priority,
                       np.zeros(len(req), np.int64), req.input_tokens, req.output_tokens)
    cfg = dict(cfg, prefetch=False)

    class General(DynamicBatcher):
        def reset(self, requests, instances):
            super().reset(requests, instances)
            self._fast = False
            self.decide = self._decide_general

    fast, general = DynamicBatcher(**cfg), General(**cfg)
    a = simulate(req, fast, FixedCost(0.3), instances=instances, record=True)
    b = simulate(req, general, FixedCost(0.3), instances=instances, record=True)
    assert fast._fast == (one_seq_len or len(set(req.seq_len.tolist())) == 1)
    assert a.decisions == b.decisions
