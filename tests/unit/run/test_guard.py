"""A user's policy that spins, strands requests or raises ends the run with one line."""

from __future__ import annotations

import numpy as np
import pytest

from broken_policies import Never, Raises, Spin
from policies import DynamicBatcher
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.errors import InputError
from schedsim.run.guard import SPIN_LIMIT, GuardedPolicy, PolicySpins, check_served, guard, unwrap


class Cost:
    def sample_s(self, samples, seq_len, rng):
        rng.random()
        return 1e-3


def requests(n: int = 50, gap_s: float = 1e-3) -> Requests:
    arrival = (np.arange(n) * gap_s * 1e9).astype(np.int64)
    ones, zeros = np.ones(n, np.int32), np.zeros(n, np.int32)
    return Requests(arrival, ones, zeros, zeros.astype(np.int16), np.zeros(n, np.int64), zeros, zeros)


def test_a_spinning_policy_is_stopped_with_the_time():
    with pytest.raises(PolicySpins, match=r"--policy my\.py:Spin: woke 100,000 times in a row between t = "):
        simulate(requests(), GuardedPolicy(Spin(), "my.py:Spin"), Cost())


def test_a_policy_spinning_between_frequent_arrivals_is_stopped_too():
    # Arrivals every 20 us reset a streak long before SPIN_LIMIT wake-ups; the share catches it.
    with pytest.raises(PolicySpins, match="with something to decide on"):
        simulate(requests(200_000, 20e-6), GuardedPolicy(Spin(), "my.py:Spin"), Cost())


def test_a_policy_that_strands_requests_is_named_with_the_time():
    result = simulate(requests(), GuardedPolicy(Never(), "my.py:Never"), Cost())
    with pytest.raises(InputError, match=r"--policy my\.py:Never: stopped at t = 0\.049000000 s with 50 requests "
                                         "queued and every instance idle"):
        check_served(result, "my.py:Never")


def test_an_exception_in_the_policy_says_which_hook_where_and_when():
    with pytest.raises(InputError) as info:
        simulate(requests(), GuardedPolicy(Raises(), "my.py:Raises"), Cost())
    text = str(info.value)
    assert text.startswith("--policy my.py:Raises: decide raised ZeroDivisionError: division by zero (at t = 0.000000000 s) in ")
    assert "broken_policies.py line" in text and "\n" not in text


def test_a_guarded_policy_gives_the_same_result_as_the_bare_one():
    bare = simulate(requests(500, 1e-4), DynamicBatcher(max_batch_size=8), Cost(), seed=3)
    wrapped = simulate(requests(500, 1e-4), GuardedPolicy(DynamicBatcher(max_batch_size=8), "x:y"), Cost(), seed=3)
    assert np.array_equal(bare.end_ns, wrapped.end_ns) and np.array_equal(bare.batch_size, wrapped.batch_size)


def test_only_users_policies_are_guarded():
    builtin = DynamicBatcher()
    assert guard(builtin, "dynamic") is builtin
    wrapped = guard(Spin(), "my.py:Spin")
    assert isinstance(wrapped, GuardedPolicy) and isinstance(unwrap(wrapped), Spin)
    assert SPIN_LIMIT == 100_000
