"""Start-up of ``schedsim run``: what a small run costs before and around its simulation.

    python benchmarks/bench_startup.py              # 10 rounds, about a minute
    python benchmarks/bench_startup.py --rounds 20
    python benchmarks/bench_startup.py --before /tmp/old   # also a copy of older code, in turn

Commands, each a fresh process, run in turn round after round so that other load falls on
all of them alike (figures: min and median of CPU time, user + system, and of wall time):

- ``schedsim run --help``;
- ``schedsim run SMALL --json --band 0`` and the same printing tables, SMALL a 1,000-request
  Poisson trace (the whole run: start-up, reading the trace and profile, simulating,
  the capacity measurement, the summary);
- the floor under them: ``python -c pass``; a process importing only numpy, pyarrow and
  pyarrow.csv, which a run reading a larger CSV trace or a Parquet one needs; one importing
  numpy alone and one importing numpy and typer, with one OpenBLAS thread (as ``schedsim run``
  sets it): the libraries' share of a small run, whose plain CSV trace is read without pyarrow;
- ``python -c "import typer"``: the command-line library's own share;
- with ``--before DIR`` (a copy of older code, e.g. ``git archive REV | tar -x -C DIR``), its
  ``run SMALL --json --band 0`` and tables run too, from DIR with DIR on ``PYTHONPATH``, in the
  same rounds.

Then one ``python -X importtime`` of the small run, summed by top-level package. Writes
benchmarks/results/bench_startup.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child import measure, write_report

HERE = Path(__file__).resolve().parent
FLOOR = "import numpy, typer (OPENBLAS_NUM_THREADS=1)"
NUMPY = "import numpy (OPENBLAS_NUM_THREADS=1)"
RESULTS = HERE / "results"


def import_times(cmd: list[str]) -> dict:
    """``-X importtime`` self times summed by top-level package (schedsim by subpackage), ms."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *cmd], capture_output=True, text=True)
    total: collections.Counter = collections.Counter()
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S+)", line)
        if m:
            name = m.group(2).split(".")
            total[".".join(name[:2]) if name[0] == "schedsim" else name[0]] += int(m.group(1))
    return {k: round(v / 1000, 1) for k, v in total.most_common(25)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_startup.json")
    ap.add_argument("--before", type=Path, help="a copy of older code to run in turn (its root folder)")
    args = ap.parse_args()
    import compileall

    for root in (HERE.parent, *([args.before.resolve()] if args.before else [])):
        for package in ("schedsim", "policies"):  # as an installed copy runs: from cached bytecode
            compileall.compile_dir(root / package, quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    small = tmp / "small.csv"
    subprocess.run([sys.executable, "-m", "schedsim.cli.main", "trace", "gen", "--seed", "1", "--arrival", "poisson",
                    "--rate", "1000", "--seq-len", "fixed:128", "--n", "1000", "--out", str(small)],
                   check=True, stdout=subprocess.DEVNULL)
    run = [sys.executable, "-m", "schedsim.cli.main", "run", str(small), "--band", "0"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import numpy, pyarrow, pyarrow.csv": [sys.executable, "-c", "import numpy, pyarrow, pyarrow.csv"],
        # What a small schedsim run loads before any of its own modules, with one OpenBLAS thread
        # as it sets.
        NUMPY: [sys.executable, "-c", "import numpy"],
        FLOOR: [sys.executable, "-c", "import numpy, typer"],
        "import typer": [sys.executable, "-c", "import typer"],
        "schedsim run --help": [sys.executable, "-m", "schedsim.cli.main", "run", "--help"],
        "schedsim run SMALL --json --band 0": [*run, "--json"],
        "schedsim run SMALL --band 0 (tables)": run,
    }
    # ``python -m`` puts the working directory first on sys.path: the older copy runs from its own.
    where = {k: None for k in commands}
    if args.before:
        before = args.before.resolve()
        commands["before: run SMALL --json --band 0"] = [*run, "--json"]
        commands["before: run SMALL --band 0 (tables)"] = run
        where |= {k: before for k in commands if k.startswith("before:")}
    runs: dict[str, list] = {k: [] for k in commands}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1") if name in (NUMPY, FLOOR) else None
            if where[name]:
                env = dict(os.environ, PYTHONPATH=str(where[name]))
            runs[name].append(measure(cmd, env, cwd=where[name]))
        loads.append(os.getloadavg()[0])
    report: dict = {"benchmark": "bench_startup", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "rounds": args.rounds, "cores": os.cpu_count(), "python": sys.version.split()[0],
                    "loadavg_1m_min": min(loads), "loadavg_1m_max": max(loads), "commands": {}}
    print(f"{'command':40} {'CPU s min':>9} {'median':>7} {'wall s min':>10} {'median':>7}")
    for name, rs in runs.items():
        cpu, wall = [r["cpu_s"] for r in rs], [r["wall_s"] for r in rs]
        report["commands"][name] = {"cpu_s_min": min(cpu), "cpu_s_median": statistics.median(cpu),
                                    "wall_s_min": min(wall), "wall_s_median": statistics.median(wall),
                                    "cmd": " ".join(commands[name]).replace(str(small), "SMALL"), "runs": rs}
        print(f"{name:40} {min(cpu):9.3f} {statistics.median(cpu):7.3f} {min(wall):10.3f} "
              f"{statistics.median(wall):7.3f}")
    report["importtime_ms_small_run_json"] = import_times(["-m", "schedsim.cli.main", "run", str(small), "--band", "0",
                                                           "--json"])
    print(f"load average {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores")
    print("imports of the small run (ms, -X importtime self times): "
          + ", ".join(f"{k} {v}" for k, v in list(report["importtime_ms_small_run_json"].items())[:10]))
    write_report(report, args.out)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
