"""Routers, the fleet driver and the autoscaler: golden logs on hand-made traces, and each
replica of a fleet equal to simulate() on its own requests."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from golden import FixedCost
from policies.basic import NoBatching, StaticBatching
from policies.dynamic import DynamicBatcher
from schedsim.planning.autoscale import UtilizationAutoscaler
from schedsim.errors import InputError
from schedsim.planning.fleet import REPLICA_SEED_STRIDE, local_requests, simulate_fleet
from schedsim.registry import load_router
from schedsim.core.policy import Requests
from schedsim.core.results import COMPLETED
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace


def requests(arrivals_ms, **columns):
    return Requests.from_trace(Trace.from_arrivals(np.asarray(arrivals_ms, float) / 1e3, **columns))


# Two replicas, no batching, 10 ms per request. Hand-worked:
# round robin alternates. JSQ counts requests waiting: at 1 ms replica 0's first request
# is already running, its queue is empty, so the tie goes to replica 0 again. LOR counts
# waiting + running: at 15 ms replica 1 has finished everything, replica 0 still runs one.
GOLDEN = {
    "round-robin": ([0, 1, 0, 1, 0, 1], [0, 1, 10, 15, 20, 25]),
    "jsq": ([0, 0, 1, 0, 1, 1], [0, 10, 2, 20, 16, 26]),
    "least-outstanding": ([0, 1, 0, 1, 0, 1], [0, 1, 10, 15, 20, 25]),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_router_golden_routing(name):
    fr = simulate_fleet(requests([0, 1, 2, 15, 16, 17]), NoBatching, FixedCost(10.0), replicas=2,
                        router=load_router(name))
    routing, start_ms = GOLDEN[name]
    assert fr.replica.tolist() == routing
    assert (fr.result.start_ns / 1e6).tolist() == start_ms
    assert fr.result.instances == 2 and sorted(set(fr.result.instance.tolist())) == [0, 1]


def test_round_robin_needs_one_pass_and_state_routers_two():
    req = requests(np.arange(0, 200, 0.5))
    assert simulate_fleet(req, NoBatching, FixedCost(0.9), replicas=3, router=load_router("rr")).passes == 1
    assert simulate_fleet(req, NoBatching, FixedCost(0.9), replicas=3, router=load_router("jsq")).passes == 2


def test_static_remainder_leaves_when_the_fleets_trace_ends():
    # Simulated alone, replica 0 would flush its one request at its own last arrival (0 ms);
    # in the fleet it cannot know that no more will come until the fleet's last one (1 ms).
    fr = simulate_fleet(requests([0, 1]), lambda: StaticBatching(batch_size=3), FixedCost(1.0), replicas=2,
                        router=load_router("jsq"))
    assert fr.replica.tolist() == [0, 1]
    assert (fr.result.start_ns / 1e6).tolist() == [1.0, 1.0]



def test_users_router_by_module_path():
    router = load_router("golden:Sticky")
    fr = simulate_fleet(requests([0, 1, 2]), NoBatching, FixedCost(1.0), replicas=3, router=router)
    assert fr.replica.tolist() == [2, 2, 2]


def test_users_router_from_a_file(tmp_path):
    path = tmp_path / "my_router.py"
    path.write_text("from policies.routers import Router\n"
                    "class Even(Router):\n"
                    "    def choose(self, now_ns, row, active):\n"
                    "        return active[row % 2 * (len(active) - 1)]\n")
    fr = simulate_fleet(requests([0, 1, 2, 3]), NoBatching, FixedCost(1.0), replicas=3,
                        router=load_router(f"{path}:Even"))
    assert fr.replica.tolist() == [0, 2, 0, 2]


@pytest.mark.parametrize("spec", ["nope", "no_such_module_xyz:R", "golden:FixedCost", "missing.py:R"])
def test_bad_router_is_one_input_error(spec):
    with pytest.raises(InputError, match="--router"):
        load_router(spec)


POLICIES = {
    "none": NoBatching,
    "dynamic": lambda: DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(2, 4), max_queue_delay_us=700),
    "static": lambda: StaticBatching(batch_size=3, max_wait_us=2000),
    "dynamic-timeouts": lambda: DynamicBatcher(max_batch_size=4, max_queue_delay_us=300,
                                               default_timeout_us=4000, priority_levels=2),
}


@settings(max_examples=25, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 1.5), min_size=1, max_size=60),
       samples=st.lists(st.integers(1, 2), min_size=60, max_size=60),
       priority=st.lists(st.integers(0, 2), min_size=60, max_size=60),
       replicas=st.integers(1, 3), router=st.sampled_from(["rr", "jsq", "lor"]),
       policy=st.sampled_from(sorted(POLICIES)), seed=st.integers(0, 5))
def test_each_replica_equals_simulate_on_its_own_requests(gaps, samples, priority, replicas, router,
                                                           policy, seed):
    n = len(gaps)
    req = requests(np.cumsum(gaps), batch=np.array(samples[:n]), priority=np.array(priority[:n]))
    cost = FixedCost(lambda s: 0.5 + 0.3 * s)
    fr = simulate_fleet(req, POLICIES[policy], cost, replicas=replicas, router=load_router(router), seed=seed)
    assert (fr.replica >= 0).all()
    assert (fr.result.status == COMPLETED).all() or policy == "dynamic-timeouts"
    assert (fr.result.batch_samples <= 8).all()
    if policy == "static":
        return  # it flushes at the end of the trace, which a replica learns only at the fleet's
    for r, part in enumerate(fr.replica_results):
        rows = np.flatnonzero(fr.replica == r)
        alone = simulate(local_requests(req, rows), POLICIES[policy](), cost, seed=seed + r * REPLICA_SEED_STRIDE)
        for col in ("start_ns", "end_ns", "status", "batch_size"):
            assert np.array_equal(getattr(alone, col), getattr(part, col)), (r, col)
        assert np.array_equal(fr.result.end_ns[rows], alone.end_ns)


def test_one_replica_fleet_is_the_plain_simulation():
    req = requests(np.arange(0, 50, 0.3))
    fr = simulate_fleet(req, POLICIES["dynamic"], FixedCost(lambda s: 0.4 + 0.1 * s), replicas=1,
                        router=load_router("jsq"), seed=3)
    alone = simulate(req, POLICIES["dynamic"](), FixedCost(lambda s: 0.4 + 0.1 * s), seed=3)
    assert np.array_equal(fr.result.end_ns, alone.end_ns)
    assert np.array_equal(fr.result.batch_start_ns, alone.batch_start_ns)


# --- autoscaler ---------------------------------------------------------------------------

def test_autoscaler_decisions_golden():
    auto = UtilizationAutoscaler(0.8, 0.3, window_s=3, interval_s=1, cold_start_s=0, min_replicas=1,
                                 max_replicas=2)
    log = []
    for t, (util, active, starting) in enumerate([
            (0.9, 1, 0), (0.95, 1, 0), (0.85, 1, 0),   # above 0.8 for the window: add
            (0.9, 1, 1),                               # the new one is starting: wait, forget
            (0.9, 2, 0), (0.9, 2, 0), (0.9, 2, 0),     # at max_replicas: no more
            (0.2, 2, 0), (0.1, 2, 0), (0.5, 2, 0),     # one sample not low enough
            (0.2, 2, 0), (0.1, 2, 0), (0.2, 2, 0),     # low for the window: remove
            (0.1, 1, 0), (0.1, 1, 0), (0.1, 1, 0)]):   # at min_replicas: stay
        log.append(auto.decide(t, util, active, starting))
    assert log == [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0]


def test_autoscaled_fleet_golden_log():
    # 1 request every 5 ms, 10 ms each: twice what one replica serves, for 4 s.
    req = requests(np.arange(0, 4000, 5.0))
    auto = UtilizationAutoscaler(0.8, 0.3, window_s=0.5, interval_s=0.25, cold_start_s=0.3,
                                 min_replicas=1, max_replicas=3)
    fr = simulate_fleet(req, NoBatching, FixedCost(10.0), replicas=3, router=load_router("lor"),
                        autoscaler=lambda: replace(auto, history=[]), initial_replicas=1)
    log = [(t / 1e9, what, r, k) for t, what, r, k in fr.scaling_log]
    assert log == [(0.5, "launch", 1, 1), (0.8, "ready", 1, 2), (1.25, "launch", 2, 2), (1.55, "ready", 2, 3)]
    # Nothing is routed to a replica before it is ready.
    arrival_s = req.arrival_ns / 1e9
    assert arrival_s[fr.replica == 1].min() >= 0.8 and arrival_s[fr.replica == 2].min() >= 1.55
    # Paid: replica 0 from the first arrival, the others from their launch, all to the last completion.
    end_s = fr.result.end_ns.max() / 1e9
    assert fr.gpu_ns / 1e9 == pytest.approx(3 * end_s - 0.5 - 1.25, abs=1e-9)


def test_autoscaler_removes_an_idle_replica_and_pays_until_drained():
    # Busy for 1 s on two replicas, then a trickle: one replica goes.
    arrivals = np.concatenate([np.arange(0, 1000, 4.0), np.arange(1000, 4000, 100.0)])
    auto = UtilizationAutoscaler(0.8, 0.3, window_s=0.5, interval_s=0.25, cold_start_s=0.0,
                                 min_replicas=1, max_replicas=2)
    fr = simulate_fleet(requests(arrivals), NoBatching, FixedCost(5.0), replicas=2, router=load_router("rr"),
                        autoscaler=lambda: replace(auto, history=[]), initial_replicas=2)
    actions = [(t / 1e9, what, r) for t, what, r, _ in fr.scaling_log]
    assert actions == [(1.5, "remove", 1)]
    arrival_s = requests(arrivals).arrival_ns / 1e9
    assert (fr.replica[arrival_s >= 1.5] == 0).all()
