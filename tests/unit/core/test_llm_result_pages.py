"""The simulator works out its result with numpy's huge-page advice off (each of a busy
run's large result arrays is written once; compacting memory for huge pages cost more than
it saved) and leaves the setting as it found it, also when the run fails."""

from __future__ import annotations

import pytest

from policies.paged_kv import PagedKV
from schedsim.core import llm_simulate
from schedsim.core.llm_simulate import _set_madvise_hugepage, simulate_llm
from llm_helpers import LinearCost, llm_requests

pytestmark = pytest.mark.skipif(_set_madvise_hugepage is None, reason="this numpy has no huge-page switch")


def advice() -> bool:
    """numpy's current setting (setting it returns the one before)."""
    was = _set_madvise_hugepage(True)
    _set_madvise_hugepage(was)
    return was


def run():
    req = llm_requests([0.0, 0.001, 0.002], [40, 300, 17], [5, 3, 9])
    return simulate_llm(req, PagedKV(num_gpu_blocks=64), LinearCost())


@pytest.mark.parametrize("setting", [True, False])
def test_the_setting_is_left_as_found(setting):
    was = _set_madvise_hugepage(setting)
    try:
        run()
        assert advice() is setting
    finally:
        _set_madvise_hugepage(was)


def test_off_while_the_result_is_worked_out_and_restored_after_a_failure(monkeypatch):
    seen = []

    def failing(self):
        seen.append(advice())
        raise RuntimeError("result")

    monkeypatch.setattr(llm_simulate._Driver, "_result", failing)
    was = _set_madvise_hugepage(True)
    try:
        with pytest.raises(RuntimeError, match="result"):
            run()
        assert seen == [False]
        assert advice() is True
    finally:
        _set_madvise_hugepage(was)


def test_the_same_result_either_way():
    was = _set_madvise_hugepage(True)
    try:
        a = run()
    finally:
        _set_madvise_hugepage(was)
    b = run()
    for name, value in vars(a).items():
        if hasattr(value, "tolist"):
            assert value.tolist() == getattr(b, name).tolist(), name


def test_a_numpy_without_the_switch_gives_the_same_result(monkeypatch):
    import numpy as np

    want = run()
    monkeypatch.setattr(llm_simulate, "_set_madvise_hugepage", None)
    got = run()
    for name in ("status", "first_token_ns", "end_ns", "step_start_ns", "step_end_ns"):
        assert np.array_equal(getattr(got, name), getattr(want, name))
