"""Per-batch timestamps written by schedsim's Triton model itself: a server-side record that
holds at any load.

Triton's per-request trace is the natural record, but in Triton 2.51 (the wheel schedsim
installs) tracing kills the server under load: a mutex deleted while held, fixed upstream
after that release (triton-inference-server/server#7795, #8144). On the H200, 5 of 20
servers died with one request in 8 or 32 traced, and a CPU server died at one in 1 after
1,451 requests at 1,500 req/s.

So the builtin model (:mod:`schedsim.triton.python_model`) records, for every execution,
the monotonic time its ``execute`` began and finished, its instance, and the ids of its
requests: one line per execution, written with one ``os.write`` on an append-only file
(no buffer to lose if the server dies; a few microseconds per batch). Client and server
run on one host in these measurements, so the times share the client's monotonic clock,
and per request ``sent -> execute end`` is the server-side latency without the response's
way back: queue, inbound path and compute.

Line format (space-separated): ``start_ns end_ns instance id,id,...``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from schedsim.errors import InputError

PARAMETER = "execution_log"
"""The model config's string parameter naming the folder the log goes into."""


class ExecutionLogWriter:
    """Inside the model: one append-only file per instance."""

    def __init__(self, folder: str, instance: str):
        Path(folder).mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance) or "instance"
        self.instance = safe
        self.fd = os.open(Path(folder) / f"{safe}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @staticmethod
    def now() -> int:
        return time.monotonic_ns()

    def batch(self, start_ns: int, end_ns: int, request_ids) -> None:
        ids = ",".join(i.replace(",", "_").replace(" ", "_") or "-" for i in request_ids)
        os.write(self.fd, f"{start_ns} {end_ns} {self.instance} {ids}\n".encode())

    def close(self) -> None:
        os.close(self.fd)


def read_execution_log(folder, since_ns: int = 0, until_ns: int | None = None) -> dict:
    """request id -> (start_ns, end_ns, requests in its execution, instance) for executions that
    began in ``[since_ns, until_ns]``; a line cut short by a dying server is skipped."""
    out: dict = {}
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no execution log (was the model started with {PARAMETER}?)")
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ")
            if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
                continue
            start, end = int(parts[0]), int(parts[1])
            if start < since_ns or (until_ns is not None and start > until_ns):
                continue
            ids = parts[3].split(",")
            for rid in ids:
                out[rid] = (start, end, len(ids), parts[2])
    return out


def per_request(log: dict, request_ids, t0_ns: int) -> dict:
    """Columns for ``request_ids`` (NaN / -1 / "" where a request is not in the log): execution
    start and end in seconds from ``t0_ns``, requests in the execution, instance."""
    n = len(request_ids)
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    size, inst = np.full(n, -1, np.int64), [""] * n
    for k, rid in enumerate(request_ids):
        rec = log.get(str(rid))
        if rec is not None:
            start[k], end[k] = (rec[0] - t0_ns) / 1e9, (rec[1] - t0_ns) / 1e9
            size[k], inst[k] = rec[2], rec[3]
    return {"model_start_s": start, "model_end_s": end, "model_batch_requests": size, "model_instance": inst}


def server_side_summary(sent_s: np.ndarray, model_end_s: np.ndarray, keep: np.ndarray) -> dict:
    """Mean and percentiles (ms) of sent -> execute end over the ``keep`` requests the log has."""
    ms = (model_end_s - sent_s)[keep] * 1e3
    ms = ms[np.isfinite(ms)]
    if not ms.size:
        return {"n": 0}
    return {"n": int(ms.size), "mean_ms": float(ms.mean()),
            **{f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}, "max_ms": float(ms.max()),
            "what": "each request's client send to the end of its execution in the model (queue, inbound "
                    "path and compute; not the response's way back), from the model's execution log"}
