"""The local executor's workers never outlive the command that started them.

A script runs four slow jobs on two workers through ``run_jobs``; each job writes its
worker's pid to a file. The script finishes, or is killed while the jobs run; then no
worker may be left running.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedsim.planning.executors import run_jobs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SCRIPT = """
import os, sys, time
from schedsim.planning.executors import run_jobs

def job(i, path, sleep_s):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(sleep_s)
    return i

if __name__ == "__main__":
    done = sorted(r for _, r in run_jobs(job, [(i, sys.argv[1], float(sys.argv[2])) for i in range(4)], "local", 2))
    print(done, flush=True)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def start(tmp_path: Path, sleep_s: float) -> tuple[subprocess.Popen, Path]:
    script, pids = tmp_path / "sweep.py", tmp_path / "pids"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(pids), str(sleep_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, pids


def worker_pids(pids: Path) -> set[int]:
    return {int(line) for line in pids.read_text().split()} if pids.exists() else set()


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_workers_end_with_a_finished_command(tmp_path):
    proc, pids = start(tmp_path, 0.2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "[0, 1, 2, 3]"
    workers = worker_pids(pids)
    assert 1 <= len(workers) <= 2 and proc.pid not in workers
    assert not any(running(pid) for pid in workers)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_workers_end_with_a_killed_command(tmp_path, sig):
    proc, pids = start(tmp_path, 60)
    assert wait_until(lambda: len(worker_pids(pids)) == 2, 30), "the workers did not start"
    workers = worker_pids(pids)
    assert all(running(pid) for pid in workers)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert wait_until(lambda: not any(running(pid) for pid in workers), 10), \
        f"workers {sorted(p for p in workers if running(p))} outlived the command ({sig.name})"


def test_jobs_run_in_parallel_and_results_come_back_indexed():
    got = dict(run_jobs(pow, [(2, k) for k in range(6)], "local", 2))
    assert got == {k: 2 ** k for k in range(6)}
