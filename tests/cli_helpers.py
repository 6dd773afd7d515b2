"""Running the real ``schedsim`` command in a subprocess, and checking its one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "poisson_2000rps.csv"
PROFILE = ROOT / "tests" / "data" / "linear_profile.csv"


def schedsim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "schedsim.cli.main", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("schedsim: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
