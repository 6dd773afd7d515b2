"""What idling costs a Triton model instance: the wake curve, measured through the server.

A batch that follows another back to back costs what the busy table says. A request that
reaches an instance which sat idle takes longer: through the server on the H200, batch 1
took about twice its busy time after 50 ms of idling, and at 10% load, where most
requests find the instance idle, a busy table predicts every latency low.

So ``schedsim profile --backend triton`` sends lone requests to the zero-delay model with
a pause before each (``GAPS_MS``, shuffled, ``requests_per_gap`` of each), traces every
one of them (Triton's trace at rate 1: one request at a time, far from the load at which
tracing every request has crashed a busy server), and takes from the trace, per request:

- the instance's idle time: this request's REQUEST_START minus the previous one's
  REQUEST_END (the simulator's completion is Triton's REQUEST_END);
- the extra: this request's REQUEST_START -> REQUEST_END minus what the busy table charges
  a batch of one (its mean compute plus the dispatch overhead at batch 1).

Grouped by the pause asked for, each group gives one point of the sidecar's
``wake_curve`` (:mod:`schedsim.cost.wake`): the group's median idle time, its mean extra
and the extra's quantiles at ``PROBS``, floored at 0 (the format holds no negative extra;
the mean is floored the same way, and the fraction floored is recorded). The simulator
then adds a draw from the curve to every batch launched on an idle instance.
"""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np

from schedsim.errors import InputError

GAPS_MS = (0.0, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
"""Pauses before each lone request; the instance's idle time adds the request's round trip."""
PROBS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
"""Quantiles of the extra kept per point (the simulator draws from them)."""
ID_BASE = 1_000_000_000
"""Request ids of this phase, apart from the other phases' ids in the same trace file."""


def gap_schedule(requests_per_gap: int, rng: np.random.Generator) -> np.ndarray:
    """Pauses in seconds, ``requests_per_gap`` of each of :data:`GAPS_MS`, in a seeded random
    order (so a drift of the host does not line up with one gap)."""
    gaps = np.repeat(np.asarray(GAPS_MS) / 1e3, requests_per_gap)
    return gaps[rng.permutation(gaps.size)]


def send_gapped(url: str, grpc_url: str, protocol: str, model: str, seq_len: int, gaps_s: np.ndarray,
                seed: int, request_timeout_s: float = 60.0) -> None:
    """One client: for each pause, wait it out after the last answer, then send one request
    (id ``ID_BASE + k``) and wait for its answer. Raise a one-line InputError on the first
    failed request."""
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        ids = np.random.default_rng(seed).integers(1, 30000, (1, seq_len), dtype=np.int64)
        client = grpcclient.InferenceServerClient(grpc_url)
        inp = grpcclient.InferInput("INPUT_IDS", [1, seq_len], "INT64")
        inp.set_data_from_numpy(ids)
        try:
            for k, gap in enumerate(gaps_s.tolist()):
                _pause(gap)
                client.infer(model, [inp], request_id=str(ID_BASE + k), client_timeout=request_timeout_s)
        except Exception as exc:  # noqa: BLE001 - one line below
            raise InputError(f"Triton answered {model} with an error: {' '.join(str(exc).split())[:240]}") from None
        finally:
            client.close()
        return
    asyncio.run(_send_gapped_http(url, model, seq_len, gaps_s, seed, request_timeout_s))


def _pause(gap_s: float) -> None:
    # A spin for short pauses: sleep() overshoots a 0.2 ms pause by tens of microseconds.
    if gap_s <= 0:
        return
    end = time.perf_counter() + gap_s
    if gap_s > 2e-3:
        time.sleep(gap_s - 1e-3)
    while time.perf_counter() < end:
        pass


async def _send_gapped_http(url, model, seq_len, gaps_s, seed, request_timeout_s) -> None:
    import aiohttp

    from schedsim.triton.client import _body_parts, _post

    body = _body_parts(seq_len, 30522, np.random.default_rng(seed))
    n = gaps_s.size
    out = {"sent": np.full(n, -1, np.int64), "answered": np.full(n, -1, np.int64),
           "status": np.zeros(n, np.int32), "error": [""] * n}
    endpoint = f"http://{url}/v2/models/{model}/infer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=request_timeout_s)) as session:
        for k, gap in enumerate(gaps_s.tolist()):
            _pause(gap)
            await _post(session, endpoint, body[0] + str(ID_BASE + k).encode() + body[1], k, out)
            if out["status"][k] != 200:
                raise InputError(f"Triton answered {model} with an error: {out['error'][k][:240]}")


def wake_curve_from_trace(stamps: dict, gaps_s: np.ndarray, busy_us: float, warmup: int = 5) -> dict:
    """The sidecar's ``wake_curve`` from the traced lone requests.

    ``stamps``: request id -> {timestamp name: ns} of the server's trace file
    (:func:`schedsim.triton.live.read_trace_file`); ``gaps_s``: the pause before request ``k``
    (id ``ID_BASE + k``); ``busy_us``: what the busy table charges a batch of one. The first
    ``warmup`` requests are left out."""
    rows = []
    for rid, st in stamps.items():
        k = int(rid) - ID_BASE if rid.isdigit() else -1
        if 0 <= k < gaps_s.size and "REQUEST_START" in st and "REQUEST_END" in st:
            rows.append((k, st["REQUEST_START"], st["REQUEST_END"]))
    rows.sort()
    if len(rows) < 2:
        raise InputError(f"the idle-gap requests left {len(rows)} trace records (was the trace written?)")
    k = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([r[1] for r in rows], dtype=np.int64)
    end = np.array([r[2] for r in rows], dtype=np.int64)
    latency_us = (end - start) / 1e3
    # Each request's idle: from the previous request's end, when that request was traced too.
    consecutive = np.r_[False, np.diff(k) == 1] & (k >= warmup)
    idle_us = np.r_[np.nan, (start[1:] - end[:-1]) / 1e3]
    keep = consecutive & (idle_us > 0)
    if keep.sum() < 3 * len(GAPS_MS):
        raise InputError(f"the idle-gap requests left {int(keep.sum())} usable trace records; "
                         f"need at least {3 * len(GAPS_MS)} (was the trace written?)")
    gap_of = gaps_s[k[keep]]
    extra = latency_us[keep] - busy_us
    idle = idle_us[keep]
    points = []
    for g in sorted(set(gap_of.tolist())):
        sel = gap_of == g
        e = extra[sel]
        points.append((float(np.median(idle[sel])), g * 1e3, e, int(sel.sum())))
    points.sort(key=lambda p: p[0])
    merged: list = []
    for p in points:  # idle points must rise strictly: merge a group whose median ties the last
        if merged and p[0] <= merged[-1][0] * 1.001:
            last = merged.pop()
            e = np.concatenate([last[2], p[2]])
            merged.append((last[0], last[1], e, last[3] + p[3]))
        else:
            merged.append(p)
    floored = np.maximum(extra, 0.0)
    return {
        "idle_us": [round(p[0], 3) for p in merged],
        "extra_us": [round(float(np.mean(np.maximum(p[2], 0.0))), 3) for p in merged],
        "probs": list(PROBS),
        "extra_q_us": [[round(float(v), 3) for v in np.quantile(np.maximum(p[2], 0.0), PROBS)] for p in merged],
        "pause_ms": [p[1] for p in merged],
        "n": [p[3] for p in merged],
        "extra_raw_mean_us": [round(float(np.mean(p[2])), 3) for p in merged],
        "floored_fraction": round(float(np.mean(floored != extra)), 4),
        "busy_batch1_us": round(busy_us, 3),
        "method": ("lone requests to the zero-delay model after pauses of "
                   f"{', '.join(f'{g:g}' for g in GAPS_MS)} ms (seeded random order), every one traced: idle = "
                   "REQUEST_START minus the previous request's REQUEST_END; extra = REQUEST_START -> REQUEST_END "
                   "minus the busy table's batch 1 (mean compute + dispatch overhead at batch 1), floored at 0"),
    }


def busy_batch1_us(results: dict, dispatch_us: float) -> float:
    """What the busy table charges a batch of one, in microseconds (NaN without batch 1)."""
    res = results.get(1)
    return res.mean_ms * 1e3 + dispatch_us if res is not None else math.nan
