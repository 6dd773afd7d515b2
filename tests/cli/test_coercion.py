"""``run``'s option values converted without pydantic (schedsim.cli.coercion) against Typer's
own coercion: the same value, of the same type, or the same error message, for any text."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st
from typer._coercion import build_runtime_param
from typer._click.exceptions import BadParameter
from typer.main import get_command

from cli_helpers import ROOT, TRACE
from schedsim.cli.coercion import _PlainParam
from schedsim.cli.main import app

RUN = get_command(app).commands["run"]
CTX = RUN.context_class(RUN)
PARAMS = {p.name: p for p in RUN.params}


def outcome(runtime, param, value):
    try:
        got = runtime.coerce(value, param=param, ctx=CTX)
    except BadParameter as exc:
        return ("error", exc.format_message())
    except ValueError as exc:  # Typer's own, e.g. a NUL in a path (never in a real argv)
        return ("raised", type(exc).__name__, str(exc))
    return ("value", type(got).__name__, repr(got))


def same_as_typer(name, value):
    param = PARAMS[name]
    fast = param.get_runtime_param()
    assert isinstance(fast, _PlainParam), name
    assert outcome(fast, param, value) == outcome(build_runtime_param(param.type_descriptor), param, value)


def test_every_plain_option_of_run_is_converted_without_pydantic():
    kinds = {n for n, p in PARAMS.items() if not isinstance(p.get_runtime_param(), _PlainParam)}
    assert kinds == set(), kinds


NUMBERISH = st.text(alphabet="0123456789+-._eE xn/a", max_size=12)
SAMPLES = ["7", "+7", "-0", "007", " 7", "7 ", "1_000", "7.0", "7.5", "1e3", "1.", ".5", "inf", "nan", "", "٣",
           "99999999999999999999999", "1e400", "-1e-400", "0.1", "4.35", "2.5e-7", "x"]


@pytest.mark.parametrize("name", ["max_batch_size", "seed", "replicas", "warmup_s", "rate_scale", "band",
                                  "dispatch_overhead_us", "policy", "router"])
@pytest.mark.parametrize("value", SAMPLES + [None, 3, 2.5, True])
def test_samples_convert_as_typer_does(name, value):
    same_as_typer(name, value)


@settings(max_examples=300, deadline=None)
@given(NUMBERISH | st.text(max_size=8) | st.from_regex(r"[+-]?[0-9]{1,20}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?",
                                                        fullmatch=True))
def test_numbers_convert_as_typer_does(text):
    for name in ("max_batch_size", "rate_scale", "band", "policy"):
        same_as_typer(name, text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab./~ -_\x00é", max_size=10))
def test_paths_convert_as_typer_does(text):
    for name in ("trace", "profile", "out"):
        same_as_typer(name, text)
    same_as_typer("contention_profile", (text, "b.csv"))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=3))
def test_repeated_options_convert_as_typer_does(values):
    same_as_typer("param", tuple(values))
    same_as_typer("slo", tuple(values))


def test_run_imports_neither_pydantic_nor_rich_with_json(tmp_path):
    code = ("import sys; from schedsim.cli.main import main; "
            f"rc = main(['run', {str(TRACE)!r}, '--json', '--band', '0', '--max-batch-size', '32', "
            f"'--rate-scale', '0.5', '--out', {str(tmp_path / 'o')!r}]); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'rich'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout[-500:] + proc.stderr


def test_help_imports_no_numpy():
    code = ("import sys; from schedsim.cli.main import main; rc = main(['run', '--help']); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'rich', 'numpy'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout[-500:] + proc.stderr
