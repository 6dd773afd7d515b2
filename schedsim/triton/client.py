"""Drive a Triton server open loop over HTTP: one asyncio client per process, as many processes as asked.

Request ``i`` is *scheduled* at ``t0 + arrival_ns[i]`` on the monotonic clock
(``time.monotonic_ns``, CLOCK_MONOTONIC: the clock Triton's own trace timestamps use on the
same machine) and sent then, whether or not earlier answers came back. Each request's
scheduled, sent and answered times are kept, so latency can count from the schedule (as
MLPerf LoadGen does) and the client's own lateness (sent - scheduled) is known apart.

The requests are dealt round-robin to ``processes`` worker processes; each warms its
connections, reports ready, and waits for the common ``t0``. The calling process watches
``should_stop`` (a dead server, a time limit) and tells the workers to stop sending; what
was sent by then is still awaited until ``request_timeout_s``.

The KServe v2 HTTP request is written here with aiohttp rather than through
``tritonclient.http.aio``: that package's import pulls in geventhttpclient and
python-rapidjson, which GPU machines without a registry lack, and the body of each request
is the same few hundred bytes but for its id (made once per seq_len).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from dataclasses import dataclass, field

import numpy as np

INPUT_NAME, OUTPUT_NAME = "INPUT_IDS", "OUTPUT"


@dataclass
class ClientRecord:
    """Per-request client-side record (row = request of the trace)."""

    scheduled_ns: np.ndarray
    """t0 + arrival, on the monotonic clock."""
    sent_ns: np.ndarray
    """When the request was handed to the connection; -1 if never sent."""
    answered_ns: np.ndarray
    """When its whole response (or error) came back; -1 if none."""
    http_status: np.ndarray
    """HTTP status of the answer; 0 when none came (connection error, timeout, not sent)."""
    error: list = field(default_factory=list)
    """Error text per request ('' when it succeeded)."""
    t0_ns: int = 0
    """The trace's time zero on the monotonic clock."""
    processes: int = 1
    """Client processes that sent the requests."""
    failures: list = field(default_factory=list)
    """Client-side failures that ended a worker (not per-request errors)."""


def _body_parts(seq_len: int, vocab: int, rng: np.random.Generator, priority: int = 0,
                timeout_us: int = 0) -> tuple[bytes, bytes]:
    """The request body around its id: ``prefix + id + suffix``."""
    ids = rng.integers(1, vocab, seq_len).tolist()
    params = {"binary_data_output": True}
    if priority:
        params["priority"] = int(priority)
    if timeout_us:
        params["timeout"] = int(timeout_us)
    rest = json.dumps({"parameters": params,
                       "inputs": [{"name": INPUT_NAME, "shape": [1, seq_len], "datatype": "INT64", "data": ids}],
                       "outputs": [{"name": OUTPUT_NAME, "parameters": {"binary_data": True}}]},
                      separators=(",", ":"))
    return b'{"id":"', b'",' + rest[1:].encode()


def _error_text(body: bytes, status: int) -> str:
    try:
        head = body.split(b"\n", 1)[0] if body[:1] == b"{" else body
        return str(json.loads(head).get("error", "")) or f"HTTP {status}"
    except (ValueError, AttributeError):
        return f"HTTP {status}: {body[:200]!r}"


async def _post(session, endpoint: str, body: bytes, j: int, out: dict) -> None:
    """POST one request; record its sent and answered times, HTTP status and error in row ``j``."""
    out["sent"][j] = time.monotonic_ns()
    try:
        async with session.post(endpoint, data=body) as r:
            payload = await r.read()
            out["answered"][j] = time.monotonic_ns()
            out["status"][j] = r.status
            if r.status != 200:
                out["error"][j] = _error_text(payload, r.status)
    except Exception as exc:  # noqa: BLE001 - every failure is a measured outcome
        out["answered"][j] = time.monotonic_ns()
        out["error"][j] = f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__


async def _send_all(url: str, model: str, rows: np.ndarray, target_ns: np.ndarray, keys: np.ndarray,
                    parts: dict, stop, request_timeout_s: float, out: dict, warmup: int,
                    connections: int = 256) -> None:
    import aiohttp

    endpoint = f"http://{url}/v2/models/{model}/infer"
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)

    # At most ``connections`` requests in flight per process: beyond that, an overloaded
    # server would be sent thousands of connections at once, and time them out.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), timeout=timeout) as session:

        async def one(j: int) -> None:
            prefix, suffix = parts[keys[j]]
            await _post(session, endpoint, prefix + str(int(rows[j])).encode() + suffix, j, out)

        # Open ``warmup`` connections before the clock starts, so that a burst does not pay
        # for connecting (these requests are not recorded).
        async def warm(key) -> None:
            prefix, suffix = parts[key]
            async with session.post(endpoint, data=prefix + b"warmup" + suffix) as r:
                await r.read()

        first = next(iter(parts))
        for _ in range(2):
            try:
                await asyncio.gather(*(warm(first) for _ in range(warmup)))
            except Exception:  # noqa: BLE001 - a server that fails will fail the run visibly
                break
        out["ready"]()
        t0 = await asyncio.get_running_loop().run_in_executor(None, out["wait_t0"])
        tasks = []
        for j in range(len(rows)):
            due = t0 + int(target_ns[j])
            while True:
                if stop.is_set():
                    break
                wait = (due - time.monotonic_ns()) / 1e9
                if wait <= 0:
                    break
                await asyncio.sleep(min(wait, 0.05))
            if stop.is_set():
                break
            tasks.append(asyncio.ensure_future(one(j)))
            if j % 64 == 63:
                await asyncio.sleep(0)  # let responses in during a burst
        if tasks:
            await asyncio.gather(*tasks)


def _worker(url, model, rows, arrival_ns, keys, parts, stop, ready_q, go, t0_value, result_q,
            request_timeout_s, warmup) -> None:
    n = len(rows)
    out = {"sent": np.full(n, -1, np.int64), "answered": np.full(n, -1, np.int64),
           "status": np.zeros(n, np.int32), "error": [""] * n,
           "ready": lambda: ready_q.put(len(rows)),
           "wait_t0": lambda: (go.wait(), t0_value.value)[1]}
    try:
        asyncio.run(_send_all(url, model, rows, arrival_ns, keys, parts, stop, request_timeout_s, out, warmup))
        result_q.put((rows, out["sent"], out["answered"], out["status"], out["error"], None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        ready_q.put(-1)
        result_q.put((rows, out["sent"], out["answered"], out["status"], out["error"],
                      f"{type(exc).__name__}: {exc}"))


def drive(url: str, model: str, arrival_ns: np.ndarray, seq_len: np.ndarray, *, processes: int = 1,
          priority: np.ndarray | None = None, timeout_us: np.ndarray | None = None, vocab: int = 30522,
          seed: int = 0, should_stop=None, before_start=None, at: tuple | None = None,
          request_timeout_s: float = 120.0, warmup: int = 16, start_delay_s: float = 0.1) -> ClientRecord:
    """Send request ``i`` at ``t0 + arrival_ns[i]`` with ``seq_len[i]`` token ids; return the record.

    ``should_stop()`` is polled every 20 ms once the run starts; when it returns a truthy
    value no further request is sent. ``before_start()`` runs after every worker is warm
    and before ``t0`` (e.g. to read the server's statistics); ``at = (offset_ns, fn)``
    runs ``fn()`` once, within 20 ms after ``t0 + offset_ns`` (e.g. at the warm-up's end).
    """
    n = len(arrival_ns)
    processes = max(1, min(int(processes), max(n, 1)))
    rng = np.random.default_rng(seed)
    prio = np.zeros(n, np.int64) if priority is None else np.asarray(priority, np.int64)
    tmo = np.zeros(n, np.int64) if timeout_us is None else np.asarray(timeout_us, np.int64)
    key_of = {}
    keys = np.empty(n, np.int64)
    for i, k in enumerate(zip(seq_len.tolist(), prio.tolist(), tmo.tolist())):
        keys[i] = key_of.setdefault(k, len(key_of))
    if not key_of:
        key_of[(int(seq_len[0]) if n else 128, 0, 0)] = 0
    parts = {v: _body_parts(s, vocab, rng, p, t) for (s, p, t), v in key_of.items()}
    ctx = mp.get_context("spawn")
    stop, go = ctx.Event(), ctx.Event()
    t0_value = ctx.Value("q", 0)
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    procs = []
    for w in range(processes):
        rows = np.arange(w, n, processes, dtype=np.int64)
        procs.append(ctx.Process(target=_worker, name=f"schedsim-triton-client-{w}", daemon=True,
                                 args=(url, model, rows, arrival_ns[rows], keys[rows], parts, stop, ready_q,
                                       go, t0_value, result_q, request_timeout_s, warmup)))
    record = ClientRecord(np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                          np.zeros(n, np.int32), [""] * n, processes=processes)
    failures = []
    try:
        for p in procs:
            p.start()
        for _ in procs:
            if ready_q.get() < 0:
                stop.set()
        if before_start is not None and not stop.is_set():
            before_start()
        record.t0_ns = time.monotonic_ns() + int(start_delay_s * 1e9)
        t0_value.value = record.t0_ns
        go.set()
        pending = len(procs)
        while pending:
            try:
                rows, sent, answered, status, error, failure = result_q.get(timeout=0.02)
            except Exception:  # queue.Empty: poll the stop condition
                if at is not None and time.monotonic_ns() >= record.t0_ns + at[0]:
                    at[1]()
                    at = None
                if should_stop is not None and not stop.is_set() and should_stop():
                    stop.set()
                if not any(p.is_alive() for p in procs) and result_q.empty():
                    failures.append("a client process died without reporting")
                    break
                continue
            pending -= 1
            record.sent_ns[rows], record.answered_ns[rows], record.http_status[rows] = sent, answered, status
            for r, e in zip(rows.tolist(), error):
                record.error[r] = e
            if failure:
                failures.append(failure)
    except KeyboardInterrupt:
        stop.set()
        failures.append("interrupted")
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=request_timeout_s + 5)
            if p.is_alive():
                p.kill()
    record.scheduled_ns[:] = record.t0_ns + np.asarray(arrival_ns, np.int64)
    record.failures = failures
    return record


def drive_closed(url: str, model: str, seq_len: int, clients: int, requests: int, *, vocab: int = 30522,
                 seed: int = 0, request_timeout_s: float = 120.0) -> ClientRecord:
    """Closed loop over HTTP, with the request bodies :func:`drive` sends: ``clients`` coroutines
    on one asyncio loop (in this process) share ``requests`` tickets, each sending its next
    request as soon as its last is answered. ``scheduled_ns`` is the sent time.

    The tickets are shared, not a quota per client, so the server's queue keeps filling
    until the last ticket is taken. A request answered with an error is sent once more at
    once (a busy H200 server answered one request in about 6,000 with HTTP 404 for a loaded
    model): one missing request would leave its batch short, held for the whole queue delay.
    Its row keeps the second attempt; a second failure stands. A request that gets no answer
    at all (``request_timeout_s`` passed, the connection refused or dropped) is not sent
    again, and no client takes another ticket: a server that died, or hung without exiting
    (Triton 2.51 after a crash in its tracing), would otherwise cost ``request_timeout_s``
    for every ticket left. Rows never sent keep ``sent`` and ``answered`` at -1."""
    import aiohttp

    body = _body_parts(seq_len, vocab, np.random.default_rng(seed))
    out = {"sent": np.full(requests, -1, np.int64), "answered": np.full(requests, -1, np.int64),
           "status": np.zeros(requests, np.int32), "error": [""] * requests}
    endpoint = f"http://{url}/v2/models/{model}/infer"

    async def run() -> None:
        timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(clients, 1)),
                                         timeout=timeout) as session:
            tickets = iter(range(requests))  # one loop: each client takes the next ticket
            unanswered = asyncio.Event()

            async def client() -> None:
                for j in tickets:
                    if unanswered.is_set():
                        return
                    request = body[0] + str(j).encode() + body[1]
                    await _post(session, endpoint, request, j, out)
                    if out["status"][j] == 0:  # no answer: the server is gone or hung
                        unanswered.set()
                        return
                    if out["status"][j] != 200:  # once more, so a stray failure leaves no batch short
                        out["error"][j] = ""
                        await _post(session, endpoint, request, j, out)

            await asyncio.gather(*(client() for _ in range(clients)))

    t0 = time.monotonic_ns()
    asyncio.run(run())
    return ClientRecord(out["sent"].copy(), out["sent"], out["answered"], out["status"], out["error"], t0_ns=t0)
