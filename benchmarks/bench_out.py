"""What ``--out`` adds to a whole ``schedsim run``, measured in turn with and without it, and
optionally against an older copy of the code in the same rounds.

    python benchmarks/bench_out.py                         # 8 rounds, about 1 minute
    python benchmarks/bench_out.py --before /tmp/old       # also the code in /tmp/old
    python benchmarks/bench_out.py --format parquet --out benchmarks/results/bench_out_parquet.json

``--before DIR``: a directory holding an older ``schedsim`` and ``policies`` (and the
``profiles`` they read), for example ``git archive COMMIT schedsim policies profiles | tar -x -C
DIR``; its commands run with ``PYTHONPATH=DIR`` (every command from a temporary directory). Each round runs every command once, in an order
reversed every other round, so that load which rises or falls falls on all of them alike.
Figures: median CPU time (user + system, all threads), its system part and minor page faults;
the outputs of the two copies are compared byte for byte (summary.json but its profile path).
Writes benchmarks/results/bench_out.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child import measure, write_report

HERE = Path(__file__).resolve().parent
FLAGS = ["--policy", "dynamic", "--max-batch-size", "64", "--max-queue-delay-us", "1000", "--json"]


def digest(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="requests in the trace")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--before", type=Path, default=None, help="a directory with older schedsim code")
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv", help="--out's --format")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_out.json")
    args = ap.parse_args()
    import compileall

    copies = {"now": None} | ({"before": args.before.resolve()} if args.before else {})
    for root in [HERE.parent, *[c for c in copies.values() if c]]:
        for package in ("schedsim", "policies"):  # as an installed copy runs: from cached bytecode
            compileall.compile_dir(root / package, quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-out-"))
    trace = tmp / "poisson.csv"
    subprocess.run([sys.executable, "-m", "schedsim.cli.main", "trace", "gen", "--seed", "1", "--arrival", "poisson",
                    "--rate", "12213.357359", "--seq-len", "fixed:128", "--n", str(args.n), "--out", str(trace)],
                   check=True, stdout=subprocess.DEVNULL)
    commands = {}
    for name, root in copies.items():
        env = dict(os.environ, **({"PYTHONPATH": str(root)} if root else {}))
        run = [sys.executable, "-m", "schedsim.cli.main", "run", str(trace), *FLAGS]
        commands[name] = (run, env)
        commands[f"{name} --out"] = ([*run, "--out", str(tmp / name), "--overwrite", "--format", args.format], env)
    runs: dict[str, list] = {k: [] for k in commands}
    for r in range(args.rounds):
        for name in (list(commands) if r % 2 == 0 else list(commands)[::-1]):
            # From the temporary directory: ``python -m`` puts the working directory first on
            # sys.path, ahead of PYTHONPATH.
            runs[name].append(measure(*commands[name], tmp))
    report = {"benchmark": "bench_out", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "requests": args.n,
              "rounds": args.rounds, "before": str(args.before) if args.before else None, "format": args.format,
              "flags": FLAGS, "commands": {}}
    print(f"{'command':14} {'CPU s median':>12} {'min':>6} {'system s':>9} {'minor faults':>12} {'wall s':>7}")
    for name, rs in runs.items():
        med = {k: statistics.median(x[k] for x in rs) for k in ("cpu_s", "sys_s", "minflt", "wall_s")}
        report["commands"][name] = {"cpu_s_median": med["cpu_s"], "cpu_s_min": min(x["cpu_s"] for x in rs),
                                    "sys_s_median": med["sys_s"], "minflt_median": med["minflt"],
                                    "wall_s_median": med["wall_s"], "runs": rs}
        print(f"{name:14} {med['cpu_s']:12.3f} {min(x['cpu_s'] for x in rs):6.3f} {med['sys_s']:9.3f} "
              f"{med['minflt']:12.0f} {med['wall_s']:7.3f}")
    for name in copies:
        c = report["commands"]
        added = c[f"{name} --out"]["cpu_s_median"] / c[name]["cpu_s_median"] - 1
        report[f"out_added_{name}"] = added
        print(f"--out adds {added:+.0%} of CPU time ({name})")
    if args.before:
        table = f"requests.{args.format}"
        same = digest(tmp / "now" / table) == digest(tmp / "before" / table)
        summaries = [json.loads((tmp / n / "summary.json").read_text()) for n in ("now", "before")]
        for s in summaries:
            s["config"].pop("profile", None)
        report["same_requests_csv"], report["same_summary_but_profile_path"] = same, summaries[0] == summaries[1]
        print(f"{table} the same: {same}; summary.json the same but the profile's path: "
              f"{summaries[0] == summaries[1]}")
    loads = [x["loadavg_1m_before"] for rs in runs.values() for x in rs]
    report["loadavg_1m_min"], report["loadavg_1m_max"] = min(loads), max(loads)
    print(f"load average {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores")
    write_report(report, args.out)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
