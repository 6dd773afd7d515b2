"""metrics.percentiles_in_place gives numpy's percentiles, float for float."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.core.metrics import PERCENTILES, percentiles_in_place

finite = st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e12, max_value=1e12)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 0.5, 1e-3, 2.5])), min_size=1, max_size=300))
def test_the_same_floats_as_numpys_percentile(values):
    values = np.array(values, np.float64)
    expected = np.percentile(values.copy(), list(PERCENTILES.values())).tolist()
    got = percentiles_in_place(values.copy())
    assert [v.hex() for v in got] == [v.hex() for v in expected]


def test_latencies_of_many_requests():
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 999, 1000, 1001, 100_000):
        values = rng.integers(0, 10**9, n) / 1e6
        expected = np.percentile(values.copy(), list(PERCENTILES.values())).tolist()
        assert percentiles_in_place(values) == expected
