"""schedsim run on random small traces and random flags: exit 0 with sensible figures, or exit 2
with one line on stderr; never a traceback, and no summary.json unless the run finished.

Most examples go through the Python entry point (schedsim.cli.main:main) to keep them cheap;
a few go through the installed command in a subprocess."""

from __future__ import annotations

import contextlib
import io
import json
import math
import string
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from cli_helpers import schedsim
from schedsim.cli.main import main

_FINITE = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def arrivals(draw) -> list[float]:
    kind = draw(st.sampled_from(["random", "one", "equal", "huge gaps", "bursts"]))
    if kind == "one":
        return [draw(_FINITE)]
    if kind == "equal":
        return [draw(_FINITE)] * draw(st.integers(2, 40))
    if kind == "huge gaps":
        return [i * draw(st.sampled_from([1e3, 1e5, 1e7])) for i in range(draw(st.integers(2, 6)))]
    if kind == "bursts":
        starts = sorted(draw(st.lists(_FINITE, min_size=1, max_size=4)))
        return sorted(s + 1e-6 * j for s in starts for j in range(draw(st.integers(1, 30))))
    return sorted(draw(st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=1, max_size=60)))


@st.composite
def flags(draw) -> list[str]:
    policy = draw(st.sampled_from(["none", "static", "dynamic"]))
    out = ["--policy", policy, "--seed", str(draw(st.integers(-1, 5))), "--band", "0"]
    if policy == "dynamic":
        out += ["--max-batch-size", str(draw(st.integers(0, 64))),
                "--max-queue-delay-us", str(draw(st.sampled_from([0, 100, 1000, 50_000])))]
        if draw(st.booleans()):
            out += ["--preferred-batch-size", draw(st.sampled_from(["8,16", "4", "1,2,64", "128", "x"]))]
    if policy == "static":
        out += ["--batch-size", str(draw(st.integers(0, 16)))]
    if draw(st.booleans()):
        out += ["--instances", str(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        out += ["--warmup-s", str(draw(st.sampled_from([0.0, 0.001, 1.0, 1e9])))]
    if draw(st.booleans()):
        out += ["--rate-scale", str(draw(st.sampled_from([0.0, 0.1, 1.0, 10.0, 1e6])))]
    return out


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _check(rc: int, stdout: str, stderr: str, out_dir: Path) -> None:
    assert "Traceback" not in stderr + stdout
    if rc == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("schedsim: error: "), stderr
        assert not (out_dir / "summary.json").exists()
        return
    assert rc == 0, (rc, stderr)
    summary = json.loads(stdout)
    assert (out_dir / "summary.json").exists()
    n = summary["requests"]
    assert summary["completed"] + summary["rejected"] + summary["failed"] + summary["unfinished"] == n
    if summary["completed"]:
        for key in ("p50_ms", "p99_ms", "mean_ms", "mean_batch_size"):
            assert summary[key] is not None and math.isfinite(summary[key]) and summary[key] >= 0, key
    assert summary["capacity_rps"] is None or summary["capacity_rps"] > 0
    # Headroom needs an offered rate, which takes two arrivals at different times.
    if summary["offered_rps"] is not None:
        assert summary["headroom"] is None or summary["headroom"] > 0


def _arrivals_csv(arrival_s: list[float]) -> bytes:
    return ("arrival_s\n" + "".join(f"{a!r}\n" for a in arrival_s)).encode()


def _python_entry(trace: Path, argv: list[str], out: Path) -> tuple[int, str, str]:
    return _run(["run", str(trace), *argv, "--json", "--out", str(out)])


def _command(trace: Path, argv: list[str], out: Path) -> tuple[int, str, str]:
    proc = schedsim("run", trace, *argv, "--json", "--out", out)
    return proc.returncode, proc.stdout, proc.stderr


def _run_and_check(content: bytes, argv: list[str], runner=_python_entry) -> None:
    """Write ``content`` as a trace in a fresh directory, run it with ``argv``, check the outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "t.csv", Path(tmp) / "out"
        trace.write_bytes(content)
        _check(*runner(trace, argv, out), out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrival_s=arrivals(), argv=flags())
def test_run_through_the_python_entry(arrival_s, argv):
    _run_and_check(_arrivals_csv(arrival_s), argv)


_CELL = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-2**70, 2**70).map(str),
                  st.text(string.printable, max_size=8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=st.sampled_from(["arrival_s", "arrival_s,batch", "arrival_s,seq_len,priority", "x", ""]),
       cells=st.lists(st.lists(_CELL, min_size=1, max_size=3), max_size=8), raw=st.binary(max_size=64))
def test_arbitrary_cells_and_bytes(header, cells, raw):
    content = header.encode() + b"\n" + "".join(",".join(r) + "\n" for r in cells).encode() + raw
    _run_and_check(content, ["--band", "0"])


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrival_s=arrivals(), argv=flags())
def test_run_through_the_command(arrival_s, argv):
    _run_and_check(_arrivals_csv(arrival_s), argv, _command)
