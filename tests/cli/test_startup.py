"""What a request-level ``schedsim run`` loads at start-up: not the LLM runner, the fleet or
the Triton config reader, and numpy's OpenBLAS with one thread unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import ROOT, TRACE

LAZY = ("schedsim.run.llm_runner", "schedsim.core.llm_simulate", "schedsim.cost.step_model",
        "schedsim.planning.fleet", "schedsim.triton.config")


def run_as_program(args: list[str], env: dict | None = None) -> list[str]:
    """Run ``schedsim ARGS`` as the installed script does (main() reading sys.argv); the last
    line of its stdout, split: exit status, OPENBLAS_NUM_THREADS, the LAZY modules loaded."""
    code = ("import os, sys; from schedsim.cli.main import main\n"
            "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
            f"print(rc, os.environ.get('OPENBLAS_NUM_THREADS'), *sorted(set({LAZY!r}) & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in (env or os.environ).items()})
    return proc.stdout.strip().splitlines()[-1].split() if proc.stdout.strip() else [proc.stderr[-500:]]


def test_request_level_run_loads_no_llm_fleet_or_triton_modules():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert run_as_program(["run", str(TRACE), "--json", "--band", "0"], env) == ["0", "1"]


def test_a_users_blas_threads_are_kept():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2")
    assert run_as_program(["run", str(TRACE), "--json", "--band", "0", "--policy", "none"], env) == ["0", "2"]
