"""What ``schedsim run`` and ``schedsim sweep`` run as the program set before numpy and pyarrow
load (schedsim.cli.main): pyarrow's buffers from malloc, numpy's arrays in ordinary pages; a
value the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import ROOT, TRACE

VARIABLES = ("ARROW_DEFAULT_MEMORY_POOL", "NUMPY_MADVISE_HUGEPAGE")


def after_run(env: dict, args: list[str] | None = None) -> list[str]:
    """Exit status of ``schedsim run`` (or ``args``) run as the installed script runs it,
    pyarrow's default pool afterwards, and VARIABLES as the run left them."""
    code = ("import os, sys; from schedsim.cli.main import main\n"
            "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "import pyarrow as pa\n"
            f"print(rc, pa.default_memory_pool().backend_name, *[os.environ.get(v) for v in {VARIABLES!r}])")
    args = args or ["run", str(TRACE), "--json", "--band", "0"]
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    return proc.stdout.strip().splitlines()[-1].split() if proc.stdout.strip() else [proc.stderr[-500:]]


def test_run_takes_arrow_buffers_from_malloc_and_numpy_arrays_in_ordinary_pages():
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    assert after_run(env) == ["0", "system", "system", "0"]


def test_a_users_settings_are_kept():
    env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="mimalloc", NUMPY_MADVISE_HUGEPAGE="1")
    assert after_run(env) == ["0", "mimalloc", "mimalloc", "1"]


def test_a_sweep_sets_the_same(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    args = ["sweep", str(TRACE), "--grid", "max_queue_delay_us=0,500", "--workers", "1", "--out", str(tmp_path)]
    assert after_run(env, args) == ["0", "system", "system", "0"]
