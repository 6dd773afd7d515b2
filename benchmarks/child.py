"""One measured child process, and a benchmark's report on disk: shared by the benchmarks that
time whole ``schedsim`` commands from spawn to exit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path


def measure(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run ``cmd`` (``env``: its whole environment, None to inherit ours); wall time from spawn
    to exit and the child's own CPU time and minor page faults (os.wait4), with the one-minute
    load average before it."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    err = proc.stderr.read().decode(errors="replace")   # read before waiting: a full pipe would block it
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err[-500:]}")
    return {"wall_s": time.perf_counter() - t0, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "cpu_s": usage.ru_utime + usage.ru_stime, "minflt": usage.ru_minflt, "loadavg_1m_before": load}


def write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
