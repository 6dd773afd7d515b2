"""How a fresh Triton server's lone-request time moves over its first seconds of traffic.

The host-variation record over fresh servers (``schedsim profile --backend triton
--triton-host-servers N``) times one round of lone requests on each fresh server after 50
warm-up requests, and compares it with a round of the table's own server, which comes
after the whole table and 5 rounds of lone requests. This probe starts ``--servers`` fresh
servers of the same zero-delay model one after another and, on each, times ``--rounds``
back-to-back rounds of lone requests after the same 50 warm-up requests, with the GPU's SM
clock read between rounds: whether the first round is slower than the later ones says
whether a fresh server's round measures the server or its warm-up.

    python3 experiments/triton/warmup_probe.py --out "$OUT/warmup_probe.json"          # H200
    python3 experiments/triton/warmup_probe.py --cpu --servers 1 --rounds 2 --out x.json   # a check here

Writes per server and round: n, median and mean (ms), the SM clock before the round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schedsim.profiling.host_variation import time_round  # noqa: E402
from schedsim.triton.host_record import FRESH_WARMUP_REQUESTS, lone_request  # noqa: E402
from schedsim.triton.profiling import TritonProfileSpec, _parameters, write_zero_delay_model  # noqa: E402
from schedsim.triton.server import TritonServer, find_tritonserver  # noqa: E402

def sm_clock_mhz() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--round-s", type=float, default=2.0)
    ap.add_argument("--cpu", action="store_true", help="bert-tiny on KIND_CPU (a check of the script)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.cpu:
        spec = TritonProfileSpec(model="builtin:bert-tiny", batch_sizes=(1, 2, 4, 8), seq_len=16, device="cpu")
    else:
        spec = TritonProfileSpec(model="builtin:bert-base", batch_sizes=(1, 2, 4, 8, 16, 32, 64), seq_len=128,
                                 device="cuda", precision="fp16", cuda_graphs=True)
    work = Path(tempfile.mkdtemp(prefix="warmup-probe-"))
    repo = write_zero_delay_model(spec, work / "repository")
    _, _, env = _parameters(spec)
    rng = np.random.default_rng(0)
    servers = []
    for k in range(args.servers):
        with TritonServer(repo, work / f"server_{k + 1}.log", find_tritonserver(), env=env) as server:
            call, close = lone_request(server, spec.seq_len, rng)
            rounds = []
            try:
                for _ in range(FRESH_WARMUP_REQUESTS):
                    call()
                for i in range(args.rounds):
                    clock = sm_clock_mhz()
                    _, durations = time_round(call, args.round_s)
                    rounds.append({"round": i + 1, "n": int(durations.size), "sm_clock_mhz": clock,
                                   "median_ms": float(np.median(durations)) * 1e3,
                                   "mean_ms": float(durations.mean()) * 1e3})
                    print(f"server {k + 1} round {i + 1}: median {rounds[-1]['median_ms']:.3f} ms, "
                          f"n {durations.size}, SM clock {clock}", flush=True)
            finally:
                close()
        servers.append({"server": k + 1, "ready_s": server.started_s, "rounds": rounds})
    args.out.write_text(json.dumps({"model": spec.model, "device": spec.device, "round_s": args.round_s,
                                    "warmup_requests": FRESH_WARMUP_REQUESTS, "servers": servers,
                                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
