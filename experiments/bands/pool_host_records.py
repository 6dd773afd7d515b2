"""Pool host-variation records into a profile's sidecar.

One ``schedsim profile --host-variation-s`` run sees the host for a minute, in one state.
A band that is to cover live runs at other times needs the host's other states too:
measure the record again later (or on other machines of the same type: a
profile of the smallest cell alone is enough, ``--batch-sizes 1``), then pool them here.
The profile's own record stays first, so the band's timeline is relative to the host the
table was measured on (:func:`schedsim.profiling.host_variation.combine`).

    python experiments/bands/pool_host_records.py profiles/P.json S1.json S2.json ...

Each extra argument is a record (a JSON object with ``round_medians_ms``) or a sidecar
that has one under ``host_variation``. Writes the sidecar in place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from schedsim.files import write_json
from schedsim.profiling.host_variation import combine


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        sys.exit(f"{path}: {exc}")
    if not isinstance(data, dict):
        sys.exit(f"{path}: not a JSON object")
    return data


def record_of(path: Path) -> dict:
    data = read_json(path)
    rec = data.get("host_variation", data)
    if not isinstance(rec, dict) or "round_medians_ms" not in rec:
        sys.exit(f"{path}: no host-variation record (round_medians_ms)")
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sidecar", type=Path, help="the profile's JSON sidecar; its own record is kept first")
    ap.add_argument("records", type=Path, nargs="+")
    args = ap.parse_args(argv)
    meta = read_json(args.sidecar)
    if "host_variation" not in meta:
        sys.exit(f"{args.sidecar}: no host_variation record of its own; profile with --host-variation-s")
    pooled = combine([meta["host_variation"], *(record_of(p) for p in args.records)])
    write_json(args.sidecar, meta | {"host_variation": pooled})
    print(f"{args.sidecar}: {pooled['rounds']} rounds from {len(args.records) + 1} records; between runs "
          f"{pooled.get('between_runs_cv_mean', float('nan')):.1%} (means), within {pooled.get('within_run_cv_mean', float('nan')):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
