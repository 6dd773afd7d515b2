"""``schedsim run`` run as the program takes pyarrow's buffers from malloc (schedsim.cli.main)."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import ROOT, TRACE


def pool_after_run(env: dict) -> list[str]:
    """Exit status of ``schedsim run`` run as the installed script runs it, and pyarrow's default
    pool afterwards (its backend and the environment variable that chose it)."""
    code = ("import os, sys; from schedsim.cli.main import main\n"
            "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "import pyarrow as pa\n"
            "print(rc, pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    args = ["run", str(TRACE), "--json", "--band", "0"]
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    return proc.stdout.strip().splitlines()[-1].split() if proc.stdout.strip() else [proc.stderr[-500:]]


def test_run_takes_arrow_buffers_from_malloc():
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert pool_after_run(env) == ["0", "system", "system"]


def test_a_users_arrow_pool_is_kept():
    assert pool_after_run(dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="mimalloc")) == ["0", "mimalloc", "mimalloc"]
