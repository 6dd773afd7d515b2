"""``python -m schedsim`` is the ``schedsim`` command."""

import subprocess
import sys

from cli_helpers import ROOT


def test_python_dash_m_schedsim_is_the_command():
    ok = subprocess.run([sys.executable, "-m", "schedsim", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "Usage: python -m schedsim " in ok.stdout and "run" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "schedsim", "run", "no-such-trace.csv"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "no-such-trace.csv" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
