"""Host-variation records of the CPU engine, taken one after another, spread over time.

One profiling process sees the host in one state; on a shared machine the state changes
over tens of minutes as other work starts and stops. This measures the record of
``schedsim profile --host-variation-s`` (:func:`schedsim.profiling.host_variation.measure`
on bert-tiny's batch-1 call under ONNX Runtime, 1 thread, after the idle gaps the CPU
table's profile leaves between calls) every ``--every-s`` seconds,
``--records`` times, each into OUT/record-N.json, for ``bands_cpu.py --host-records``
to pool with the profile's own record (:func:`schedsim.profiling.host_variation.combine`).

    python experiments/fidelity-cpu/host_records.py --out /tmp/host-records --records 12 --every-s 120
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from schedsim.live.engines.ort_live import OrtRunner, build_encoder_onnx
from schedsim.profiling.host_variation import measure

SEQ_LEN = 32


def idle_call(runner, rng: np.random.Generator):
    """Batch 1 after an idle gap of 0-1 ms, timed alone: the call the CPU table's profile
    times (fidelity_cpu.measure_samples), so that a round's mean compares with the table's."""
    ids = rng.integers(1000, 30522, size=(1, SEQ_LEN))
    idle = rng.uniform(0.0, 1e-3, size=100_000)
    k = iter(range(10**12))

    def call() -> float:
        time.sleep(idle[next(k) % idle.size])
        t0 = time.perf_counter()
        runner.infer(1, SEQ_LEN, ids)
        return time.perf_counter() - t0

    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--records", type=int, default=12)
    ap.add_argument("--every-s", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-s", type=float, default=2.0)
    ap.add_argument("--pause-s", type=float, default=15.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_encoder_onnx("bert-tiny", Path(tmp) / "bert-tiny.onnx")
        with OrtRunner(model, intra_op_threads=1, vocab=30522) as runner:
            for k in range(args.records):
                start = time.monotonic()
                rec = measure(idle_call(runner, np.random.default_rng(k)), rounds=args.rounds,
                              round_s=args.round_s, window_s=0.25, pause_s=args.pause_s,
                              what=f"one batch of 1 at seq_len {SEQ_LEN} after 0-1 ms idle, wall time around the call")
                rec["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                (args.out / f"record-{k + 1}.json").write_text(json.dumps(rec, indent=1))
                print(rec["measured_at"], "round means ms", rec["round_means_ms"], flush=True)
                time.sleep(max(0.0, args.every_s - (time.monotonic() - start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
