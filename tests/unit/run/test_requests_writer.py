"""requests.csv is written on a thread from the moment a run's result exists: the same files as
writing it at the end, and none left behind by a run that fails meanwhile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from schedsim.errors import InputError
from schedsim.run import runner
from schedsim.run.report import write_outputs
from schedsim.run.spec import RunSpec

TRACE = Path(__file__).resolve().parents[3] / "traces" / "poisson_2000rps.csv"


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_written_early_or_at_the_end_the_files_are_the_same(tmp_path, monkeypatch, fmt):
    early = runner.execute(RunSpec(trace=TRACE, out=tmp_path / "early", out_format=fmt, band=0))
    real = runner._simulate_and_report

    def without_early_writer(spec, *args):
        writing = args[-1]
        outcome = real(dataclasses.replace(spec, out=None), *args)
        outcome.written = write_outputs(spec.out, outcome.results[0], args[0].trace.request_id, outcome.summary,
                                        fmt=spec.out_format)
        assert writing == []
        return outcome
    monkeypatch.setattr(runner, "_simulate_and_report", without_early_writer)
    late = runner.execute(RunSpec(trace=TRACE, out=tmp_path / "late", out_format=fmt, band=0))
    assert [p.name for p in early.written] == [p.name for p in late.written]
    for a, b in zip(early.written, late.written):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_a_run_that_fails_after_its_result_leaves_no_requests_file(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise InputError("--slo: refused for the test")
    monkeypatch.setattr(runner, "request_capacity", refuse)
    out = tmp_path / "run"
    with pytest.raises(InputError, match="refused for the test"):
        runner.execute(RunSpec(trace=TRACE, out=out, band=0))
    assert list(out.iterdir()) == []  # neither requests.csv nor its temporary file
