"""Serving-loop calibration at intermediate loads: the wake-up cost as a function of idle time.

calibrate_h200.py's light loops (50 req/s) see idle gaps of tens of ms, its overloaded loops
none; the cells sit in between. Here the live runner serves no-batching and delay-0 dynamic
traces at a spread of light rates (never a validation cell's trace), so every launch's idle
gap before it and its extra cost over the table can be read from batches.csv.

    PYTHONPATH=. python3 experiments/fidelity/calibrate_loops.py --out "$OUT/loops"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_h200 import bert_runner, serving_loop  # noqa: E402

LOOPS = [("none", {}, r) for r in (100.0, 300.0, 700.0, 1200.0)] + \
        [("dynamic", {"max_batch_size": 64, "max_queue_delay_us": 0}, r) for r in (1000.0, 4000.0)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each loop's trace")
    ap.add_argument("--out", type=Path, required=True, help="directory for loop_*.csv and loops.json")
    args = ap.parse_args(argv)
    info = {}
    with bert_runner() as runner:
        args.out.mkdir(parents=True, exist_ok=True)
        for policy, params, rate in LOOPS:
            name = f"{policy}_{rate:g}"
            info[name] = serving_loop(runner, args.out, name, policy, params, rate, args.seconds)
            print(name, json.dumps(info[name]["dispatch_us"]), flush=True)
    (args.out / "loops.json").write_text(json.dumps(info, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
