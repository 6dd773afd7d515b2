"""Progress of a run: on a terminal's stderr only, never with --quiet, never in stdout's JSON."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

from cli_helpers import ROOT, TRACE, schedsim


def _run_with_terminal_stderr(*args) -> tuple[str, str, int]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "schedsim.cli.main", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    os.close(leader)
    return out, b"".join(chunks).decode(errors="replace"), proc.returncode


def test_a_terminal_sees_the_phases_and_stdout_keeps_pure_json():
    out, err, rc = _run_with_terminal_stderr("run", TRACE, "--slo-p99-ms", "5", "--json")
    assert rc == 0
    assert json.loads(out)["capacity"]["slo"] == ["p99_ms<=5"]
    assert "simulating 20,000 requests" in err and "capacity under p99_ms<=5: trying" in err


def test_quiet_and_a_pipe_show_no_progress():
    out, err, rc = _run_with_terminal_stderr("run", TRACE, "--quiet", "--json")
    assert rc == 0 and json.loads(out)["completed"] == 20_000
    assert "simulating" not in err
    piped = schedsim("run", TRACE, "--json")
    assert piped.returncode == 0 and piped.stderr == ""
