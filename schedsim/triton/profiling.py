"""``schedsim profile --backend triton``: a cost table measured through a real Triton server, under load.

A batch's cost is what Triton's dynamic batcher sees between launching it and its
responses, on a busy server: a table measured after idle gaps is wrong for a busy one
(through the server, batch 1 took about twice as long after 50 ms of idling as inside
busy cells). So each batch size ``b`` is measured on a model of its own
(``profile_b{b}``: ``max_batch_size: b``, ``max_queue_delay_microseconds`` of one second,
so the batcher sends exactly ``b`` requests when ``b`` are queued) driven closed loop by
``depth x b`` clients, one request of one sample each: while one batch runs, the next is
already queued, and the server never idles.

The clients reach the server the way ``schedsim live --backend triton`` does by default
(``protocol="http"``): coroutines on one asyncio loop posting the same KServe v2 HTTP
bodies with binary output as :mod:`schedsim.triton.client`, so the instance does the same
work per request (the output phase, compute_output, depends on how the response is sent).
``protocol="grpc"`` drives it with synchronous tritonclient gRPC calls from threads instead.

Per batch size:

- ``latency_ms_mean`` and ``n``: from Triton's batch_stats, the difference of two
  snapshots around the measured stretch (``compute_input + compute_infer +
  compute_output`` over its executions); a stretch in which Triton formed other sizes
  is flagged;
- the spread (p50/p90/p99/std/min/max and the raw samples): each execution's
  COMPUTE_START -> COMPUTE_END from Triton's trace, with one request in ``b`` traced (about
  one per batch; a trace at every request has crashed a busy GPU server) during the
  measured stretch only;
- the cycle: the client's time between the first and the last batch's answers over the
  executions between them; ``cycle - compute`` is what each batch costs the instance
  outside compute_input/infer/output (the batcher handing over the batch, the backend
  receiving requests and sending responses).

Named terms in the sidecar, and what the simulator does with them
(:class:`schedsim.cost.model.CostModel`):

- ``dispatch_overhead_us`` and ``dispatch_overhead_us_per_sample``: a least-squares line
  through ``cycle - compute`` by batch size (``a + c (b - 1)``, both floored at 0). The
  cost model adds ``dispatch_overhead_us + dispatch_overhead_us_per_sample (b - 1)`` to
  every batch of ``b`` samples, so a busy instance's cycle is the table's compute plus it;
- ``triton_terms`` (recorded, not added by the simulator): ``queue_us_at_zero_delay``, the
  time a request spends in Triton's queue when its instance is idle and the delay is 0
  (sequential single requests on ``profile_d0``); ``compute_input_us_per_request`` and
  ``compute_output_us_per_request`` there; ``batch1_sequential_ms``, a batch of 1 that
  follows a client round trip of idling; and ``request_path_us``, the client's latency
  beyond Triton's own request time (the frontend, network stack and client), which the
  simulator's server-side latency does not include.

- ``wake_curve``: the extra time of a lone request by how long its instance sat idle, from
  traced lone requests after pauses (:mod:`schedsim.triton.wake_profile`); the simulator
  adds a draw from it to every batch launched on an idle instance;
- ``pair_slowdown``: two instances on one GPU, each size beside each other size
  (:mod:`schedsim.triton.pair_profile`); the simulator's ``--instances 2`` shares the GPU
  by it.

Everything measured stays in ``OUT.triton/``: the model repository, the server's log, the
trace file, the statistics snapshots and every execution's
start and end (``executions/``, :mod:`schedsim.triton.execution_log`).
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.triton import host_record, wake_profile
from schedsim.triton.execution_log import PARAMETER as EXECUTION_LOG
from schedsim.triton.pair_profile import default_pair_sizes, measure_pair_grid, twin_name

QUEUE_DELAY_US = 1_000_000
"""Delay of the per-size models: long enough that only a full batch ever leaves."""
BUILTINS = ("bert-tiny", "bert-base")
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class TritonProfileSpec:
    """What ``schedsim profile --backend triton`` measures."""

    model: str = "builtin:bert-tiny"
    """builtin:bert-tiny or builtin:bert-base."""
    batch_sizes: tuple = (1, 2, 4, 8)
    """Batch sizes (samples = requests of one sample) to measure."""
    seq_len: int = 128
    """Tokens per request."""
    device: str | None = None
    """cpu (KIND_CPU, numpy engine) or cuda (KIND_GPU, torch with CUDA graphs); None = cpu."""
    precision: str | None = None
    """cuda: fp16, bf16 or fp32 (default fp16)."""
    cuda_graphs: bool = True
    """cuda: one CUDA graph per batch size."""
    threads: int = 1
    """cpu: BLAS threads per model instance."""
    batches: int = 200
    """Measured executions per batch size."""
    warmup_batches: int = 20
    """Executions per size before the measured stretch (not counted)."""
    warmup_s: float = 0.5
    """At least this long of warm-up per size (more executions than warmup_batches when those are quick)."""
    min_time_s: float = 1.0
    """At least this long of measurement per size (more executions than batches when those are quick)."""
    depth: int = 2
    """Batches in flight per size (depth x b clients)."""
    arrivals: str = "closed"
    """closed: the table's means from the closed loop (full batches back to back); open: from an
    open-loop Poisson stream at ``open_load`` of each size's closed-loop throughput, requests
    arriving while batches run as they do in a live run near capacity."""
    open_load: float = 0.9
    """arrivals=open: the stream's rate as a fraction of the size's closed-loop throughput."""
    host_variation_s: float = 0.0
    """Seconds per round of the host-variation record (5 rounds of lone requests through the
    server, :mod:`schedsim.profiling.host_variation`); 0 skips it."""
    host_servers: int = 0
    """Fresh servers for the host-variation record: after the table, this many servers are
    started one after another, each timing one round of lone requests, so the record's
    between-runs figure is between servers (a live run starts its own) rather than between
    rounds of one server; 0: the rounds of the table's own server."""
    protocol: str = "http"
    """http (the live client's aiohttp requests, binary output) or grpc (tritonclient threads)."""
    trace: bool = True
    """Sample per-batch times from Triton's trace (one request in b); off: means only."""
    zero_delay_requests: int = 200
    """Sequential single requests for the zero-delay terms (0 skips them)."""
    wake_requests: int = 30
    """Lone requests per pause for the wake curve (:mod:`schedsim.triton.wake_profile`; 0 skips it)."""
    pair_sizes: tuple | None = None
    """Sizes of the two-instance pair grid (:mod:`schedsim.triton.pair_profile`); None = 1, 8, 32 and
    the largest on cuda, none on cpu; () skips it."""
    seed: int = 0
    """Seed of the model weights and the token ids."""
    ready_timeout_s: float = 300.0
    """How long the server may take to load the models."""

    def check(self) -> None:
        name = self.model.partition(":")[2] if self.model.startswith("builtin:") else None
        if name not in BUILTINS:
            raise InputError(f"--model {self.model}: --backend triton profiles builtin:bert-tiny or builtin:bert-base")
        if self.device not in (None, "cpu", "cuda"):
            raise InputError(f"--device: {self.device!r} is not valid with --backend triton; expected cpu or cuda")
        if self.precision not in (None, "fp32") and self.device != "cuda":
            raise InputError(f"--precision {self.precision}: the CPU engine computes in fp32")
        if self.precision not in (None, "fp16", "bf16", "fp32"):
            raise InputError(f"--precision: {self.precision!r} is not valid; expected fp16, bf16 or fp32")
        if self.arrivals not in ARRIVALS:
            raise InputError(f"--triton-arrivals: {self.arrivals!r} is not valid; expected closed or open")
        if not (math.isfinite(self.open_load) and 0 < self.open_load <= 1):
            raise InputError(f"--triton-open-load: {self.open_load} is not valid; expected a fraction in (0, 1]")
        if not (math.isfinite(self.host_variation_s) and self.host_variation_s >= 0):
            raise InputError(f"--host-variation-s {self.host_variation_s}: must be >= 0")
        if self.host_servers < 0 or (self.host_servers and not self.host_variation_s):
            raise InputError(f"--triton-host-servers {self.host_servers}: expected an integer >= 0, "
                             "with --host-variation-s for the length of each server's round")
        if self.protocol not in PROTOCOLS:
            raise InputError(f"--triton-protocol: {self.protocol!r} is not valid; expected http or grpc")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise InputError(f"--batch-sizes: {self.batch_sizes} must be integers >= 1")
        for flag, v in (("--warmup-ms", self.warmup_s), ("--min-time-s", self.min_time_s)):
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"{flag}: {v} is not valid; expected a number >= 0")
        if any(b not in self.batch_sizes for b in self.pairs()):
            raise InputError(f"--pair-batches: {list(self.pairs())} must be among --batch-sizes {list(self.batch_sizes)}")
        if self.wake_requests and 1 not in self.batch_sizes:
            raise InputError("--triton-wake-requests: the wake curve is measured against batch 1: add 1 to "
                             "--batch-sizes, or pass --triton-wake-requests 0")
        if not 1 <= self.seq_len <= 512:
            raise InputError(f"--seq-lens: {self.seq_len} is not valid; --backend triton takes one seq_len in 1..512")
        for flag, v, lo in (("--triton-batches", self.batches, 2), ("--triton-depth", self.depth, 1),
                            ("--triton-warmup-batches", self.warmup_batches, 0),
                            ("--triton-zero-delay-requests", self.zero_delay_requests, 0),
                            ("--triton-wake-requests", self.wake_requests, 0)):
            if v < lo:
                raise InputError(f"{flag}: {v} is not valid; expected an integer >= {lo}")


    def pairs(self) -> tuple:
        """The pair grid's sizes (empty: no pair grid)."""
        if self.pair_sizes is not None:
            return tuple(sorted(set(self.pair_sizes)))
        return default_pair_sizes(self.batch_sizes) if self.device == "cuda" else ()

    def wake_on(self) -> bool:
        return bool(self.wake_requests and self.zero_delay_requests and self.trace)


@dataclass
class SizeResult:
    """One batch size's measurement."""

    batch: int
    executions: int
    compute_ms: dict
    """stage -> mean ms per execution (batch_stats difference)."""
    cycle_ms: float
    """Client time per batch between the first and the last batch's answers."""
    client_ms: np.ndarray
    """Each measured request's client latency, ms."""
    queue_us_per_request: float
    samples_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per-execution COMPUTE_START -> COMPUTE_END from the trace, ms."""
    other_sizes: dict = field(default_factory=dict)
    """Executions of other sizes during the stretch (should be none)."""
    window_ns: tuple = (0, 0)
    closed_compute_ms: dict | None = None
    """arrivals=open: the closed loop's stage means, kept beside the open stretch's."""
    open_rate_rps: float | None = None

    @property
    def mean_ms(self) -> float:
        return sum(self.compute_ms.values())


@dataclass(frozen=True)
class TritonProfileOutcome:
    path: Path | None
    sizes: int
    warnings: list


def model_name(b: int) -> str:
    return f"profile_b{b}"


ZERO_DELAY_MODEL = host_record.MODEL
ARRIVALS = ("closed", "open")
_CLIENTS = {"http": "HTTP, the live client's aiohttp requests with binary output, one asyncio loop",
            "grpc": "gRPC, synchronous tritonclient calls from threads"}


def _parameters(spec: TritonProfileSpec) -> tuple[dict, str, dict]:
    """(config parameters, instance kind, server environment)."""
    params = {"model": spec.model.partition(":")[2], "seed": spec.seed, "seq_lens": str(spec.seq_len)}
    if (spec.device or "cpu") == "cpu":
        t = str(spec.threads)
        return params | {"engine": "numpy"}, "KIND_CPU", {
            "OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t}
    return params | {"engine": "torch", "precision": spec.precision or "fp16",
                     "cuda_graphs": int(spec.cuda_graphs)}, "KIND_GPU", {}


def _hidden(spec: TritonProfileSpec) -> int:
    return 768 if spec.model.endswith("bert-base") else 128


def write_profile_repository(spec: TritonProfileSpec, root: Path) -> Path:
    """One model per batch size (only full batches leave) and the zero-delay model."""
    from schedsim.triton.repository import model_config, write_repository

    params, kind, _ = _parameters(spec)
    # Every execution's start and end, as the live runs record them: the profile's batch
    # durations and a live run's can then be compared execution by execution.
    params = params | {EXECUTION_LOG: str(root / "executions")}
    hidden = _hidden(spec)
    repo = root / "model_repository"
    for b in spec.batch_sizes:
        cfg = model_config(model_name(b), policy="dynamic", kind=kind, hidden=hidden, parameters=params,
                           params={"max_batch_size": b, "max_queue_delay_us": QUEUE_DELAY_US})
        write_repository(repo, model_name(b), cfg)
    for b in spec.pairs():  # the diagonal's second side
        cfg = model_config(twin_name(b), policy="dynamic", kind=kind, hidden=hidden, parameters=params,
                           params={"max_batch_size": b, "max_queue_delay_us": QUEUE_DELAY_US})
        write_repository(repo, twin_name(b), cfg)
    if spec.zero_delay_requests or spec.host_variation_s:
        write_zero_delay_model(spec, repo, params)
    return repo


def write_zero_delay_model(spec: TritonProfileSpec, repo: Path, params: dict | None = None) -> Path:
    """The zero-delay model (``max_queue_delay_microseconds: 0``): lone requests, the queue term,
    the wake curve and the host-variation rounds."""
    from schedsim.triton.repository import model_config, write_repository

    base, kind, _ = _parameters(spec)
    cfg = model_config(ZERO_DELAY_MODEL, policy="dynamic", kind=kind, hidden=_hidden(spec), parameters=params or base,
                       params={"max_batch_size": max(spec.batch_sizes), "max_queue_delay_us": 0})
    write_repository(repo, ZERO_DELAY_MODEL, cfg)
    return repo


def set_model_trace(url: str, model: str, rate: int | None, timeout_s: float = 10.0) -> None:
    """Trace one request in ``rate`` of ``model`` (level TIMESTAMPS) through Triton's trace
    setting endpoint; ``rate`` None turns the model's tracing off."""
    body = ({"trace_level": ["TIMESTAMPS"], "trace_rate": str(rate), "trace_count": "-1"} if rate
            else {"trace_level": ["OFF"]})
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/trace/setting", method="POST",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        r.read()


def closed_loop(grpc_url: str, model: str, seq_len: int, threads: int, requests: int,
                rng: np.random.Generator, timeout_s: float = 120.0) -> tuple[np.ndarray, np.ndarray]:
    """``threads`` clients sending ``requests`` one-sample requests in all, each client its next
    one as soon as its last is answered (synchronous gRPC); (sent_ns, answered_ns) of every
    request on the monotonic clock.

    The requests are tickets shared by all clients, not a quota each: a client that is
    answered first takes the next ticket, so the queue keeps filling until the last ticket
    (with quotas, the last few clients would leave fewer than a batch queued and wait out
    the delay)."""
    import itertools

    import tritonclient.grpc as grpcclient

    ids = rng.integers(1, 30000, (threads, 1, seq_len), dtype=np.int64)
    sent = np.zeros(requests, np.int64)
    done = np.zeros(requests, np.int64)
    tickets = itertools.count()  # next() is atomic under the GIL
    errors: list = []
    start = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        try:
            client = grpcclient.InferenceServerClient(grpc_url)
            inp = grpcclient.InferInput("INPUT_IDS", [1, seq_len], "INT64")
            inp.set_data_from_numpy(ids[k])
        except Exception as exc:  # noqa: BLE001 - reported below, one line
            errors.append(exc)
            start.abort()
            return
        try:
            start.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while (i := next(tickets)) < requests and not errors:
                sent[i] = time.monotonic_ns()
                client.infer(model, [inp], client_timeout=timeout_s)
                done[i] = time.monotonic_ns()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            client.close()

    pool = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    for t in pool:
        t.join()
    if errors:
        first = " ".join(str(errors[0]).split())
        raise InputError(f"Triton answered {model} with an error ({len(errors)} client(s) stopped): {first[:240]}")
    return sent, done


def drive_closed_loop(server, spec: TritonProfileSpec, model: str, clients: int, requests: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """:func:`closed_loop` over ``spec.protocol``: (sent_ns, answered_ns) of every request."""
    if spec.protocol == "grpc":
        return closed_loop(server.grpc_url, model, spec.seq_len, clients, requests, rng)
    from schedsim.triton.client import drive_closed

    rec = drive_closed(server.url, model, spec.seq_len, clients, requests, seed=int(rng.integers(2**31)))
    bad = np.flatnonzero((rec.http_status != 200) | (rec.answered_ns < 0))
    if bad.size:
        first = " ".join((rec.error[bad[0]] or f"HTTP {rec.http_status[bad[0]]}").split())
        raise InputError(f"Triton answered {model} with an error ({bad.size} of {requests} requests): {first[:240]}")
    return rec.sent_ns, rec.answered_ns


def settled_snapshot(url: str, model: str, inferences: int, timeout_s: float = 10.0):
    """The model's statistics once they count ``inferences`` samples: Triton answers a batch's
    requests before it adds the batch to its statistics, so a snapshot taken the moment the
    last answer arrives can miss the last batch."""
    from schedsim.triton.stats import snapshot

    deadline = time.monotonic() + timeout_s
    while True:
        now = snapshot(url, model)
        if now.inference_count >= inferences or time.monotonic() > deadline:
            return now
        time.sleep(0.005)


def _stretch_batches(spec: TritonProfileSpec, cycle_s: float) -> tuple[int, int]:
    """(extra warm-up batches, measured batches) for a size whose batch cycle is ``cycle_s``:
    at least ``warmup_s`` of warm-up and ``min_time_s`` of measurement, so small batches are
    timed over as long a stretch as large ones (and a GPU's clocks have settled)."""
    extra = max(0, math.ceil((spec.warmup_s - spec.warmup_batches * cycle_s) / cycle_s)) if cycle_s > 0 else 0
    return extra, max(spec.batches, math.ceil(spec.min_time_s / cycle_s) if cycle_s > 0 else 0)


def _measure_size(server, spec: TritonProfileSpec, b: int, rng, raw: Path) -> SizeResult:
    name = model_name(b)
    threads = spec.depth * b
    warm = spec.warmup_batches
    cycle_s = 0.0
    if warm:
        t = time.monotonic()
        drive_closed_loop(server, spec, name, threads, warm * b, rng)
        cycle_s = (time.monotonic() - t) / warm
    extra, batches = _stretch_batches(spec, cycle_s)
    if extra:
        drive_closed_loop(server, spec, name, threads, extra * b, rng)
        warm += extra
    before = settled_snapshot(server.url, name, warm * b)
    traced = spec.trace and spec.arrivals == "closed"
    if traced:
        set_model_trace(server.url, name, b)
    sent, done = drive_closed_loop(server, spec, name, threads, batches * b, rng)
    if traced:
        set_model_trace(server.url, name, None)
    after = settled_snapshot(server.url, name, (warm + batches) * b)
    d = after.since(before, f"{server.url} statistics")
    (raw / f"stats_{name}.json").write_text(json.dumps({"before": _plain(before), "after": _plain(after)}) + "\n")
    n = d.executions(b)
    if n == 0:
        raise InputError(f"{name}: Triton executed no batch of {b} during the measured stretch")
    ends = np.sort(done)
    executions = d.execution_count
    cycle_ms = (ends[-1] - ends[b - 1]) / 1e6 / max(executions - 1, 1)
    queue = d.requests.get("queue", (0, 0))
    res = SizeResult(b, n, {k: v / 1e6 for k, v in d.batch_mean_ns(b).items()}, float(cycle_ms),
                     (done - sent) / 1e6, queue[1] / queue[0] / 1e3 if queue[0] else math.nan,
                     other_sizes={s: d.executions(s) for s in d.batches if s != b and d.executions(s)},
                     window_ns=(int(sent.min()), int(done.max())))
    return _measure_open(server, spec, res, rng, raw) if spec.arrivals == "open" else res


def _measure_open(server, spec: TritonProfileSpec, closed: SizeResult, rng, raw: Path) -> SizeResult:
    """Size ``b`` again under an open-loop Poisson stream at ``open_load`` of its closed-loop
    throughput, from the live client (:func:`schedsim.triton.client.drive`): requests arrive
    while batches run, as in a live run near capacity, where they arrive in bursts between
    batches in the closed loop. The compute means (and, traced, the spread) come from this
    stretch; the cycle, and so the dispatch overhead fit, stay the closed loop's."""
    from schedsim.triton.client import drive
    from schedsim.triton.stats import snapshot

    b, name = closed.batch, model_name(closed.batch)
    rate = spec.open_load * b / (closed.cycle_ms / 1e3)
    n = closed.executions * b
    arrival = np.cumsum(rng.exponential(1e9 / rate, n)).astype(np.int64)
    processes = max(1, min(8, math.ceil(rate / 1000)))
    warm = snapshot(server.url, name).inference_count + processes * b  # drive's warm-up: b requests a process
    held: dict = {}

    def before_start() -> None:
        held["before"] = settled_snapshot(server.url, name, warm)
        if spec.trace:
            set_model_trace(server.url, name, b)

    rec = drive(server.url, name, arrival, np.full(n, spec.seq_len, np.int64), processes=processes,
                seed=int(rng.integers(2**31)), before_start=before_start, warmup=b)
    if spec.trace:
        set_model_trace(server.url, name, None)
    ok = (rec.http_status == 200) & (rec.answered_ns >= 0)
    if not ok.all() or "before" not in held:
        first = next((e for e in rec.error if e), "; ".join(rec.failures) or "no answer")
        raise InputError(f"{name}: the open-loop stream failed ({int((~ok).sum())} of {n} requests): {first[:240]}")
    before = held["before"]
    after = settled_snapshot(server.url, name, before.inference_count + n)
    d = after.since(before, f"{server.url} statistics")
    (raw / f"stats_{name}_open.json").write_text(json.dumps({"before": _plain(before), "after": _plain(after)}) + "\n")
    executed = d.executions(b)
    if executed == 0:
        raise InputError(f"{name}: Triton executed no batch of {b} during the open-loop stretch")
    queue = d.requests.get("queue", (0, 0))
    return replace(closed, executions=executed, compute_ms={k: v / 1e6 for k, v in d.batch_mean_ns(b).items()},
                   client_ms=(rec.answered_ns - rec.scheduled_ns) / 1e6,
                   queue_us_per_request=queue[1] / queue[0] / 1e3 if queue[0] else math.nan,
                   other_sizes={s: d.executions(s) for s in d.batches if s != b and d.executions(s)},
                   window_ns=(int(rec.sent_ns.min()), int(rec.answered_ns.max())),
                   closed_compute_ms=closed.compute_ms, open_rate_rps=rate)


def drive_pair(server, spec: TritonProfileSpec, model: str, clients: int, requests: int, seed: int) -> None:
    """One side of a pair: ``model`` closed loop (its own generator: the sides run in threads)."""
    drive_closed_loop(server, spec, model, clients, requests, np.random.default_rng(seed))


def _plain(stats) -> dict:
    return {"name": stats.name, "version": stats.version, "inference_count": stats.inference_count,
            "execution_count": stats.execution_count,
            "requests": {k: list(v) for k, v in stats.requests.items()},
            "batches": {str(b): {k: list(v) for k, v in st.items()} for b, st in stats.batches.items()}}


def _zero_delay(server, spec: TritonProfileSpec, rng, raw: Path) -> dict:
    warm = min(20, spec.zero_delay_requests)
    drive_closed_loop(server, spec, ZERO_DELAY_MODEL, 1, warm, rng)
    before = settled_snapshot(server.url, ZERO_DELAY_MODEL, warm)
    sent, done = drive_closed_loop(server, spec, ZERO_DELAY_MODEL, 1, spec.zero_delay_requests, rng)
    after = settled_snapshot(server.url, ZERO_DELAY_MODEL, warm + spec.zero_delay_requests)
    (raw / f"stats_{ZERO_DELAY_MODEL}.json").write_text(json.dumps({"before": _plain(before), "after": _plain(after)}) + "\n")
    d = after.since(before, f"{server.url} statistics")
    per = d.request_mean_us()
    client_us = float(np.mean(done - sent)) / 1e3
    b1 = d.batch_mean_ns(1) if d.executions(1) else None
    return {
        "queue_us_at_zero_delay": round(per.get("queue", math.nan), 3),
        "compute_input_us_per_request": round(per.get("compute_input", math.nan), 3),
        "compute_output_us_per_request": round(per.get("compute_output", math.nan), 3),
        "batch1_sequential_ms": round(sum(b1.values()) / 1e6, 6) if b1 else None,
        "request_path_us": round(client_us - per.get("success", math.nan), 3),
        "client_latency_us": round(client_us, 3),
        "requests": int(d.requests.get("success", (0, 0))[0]),
        "protocol": f"{_CLIENTS[spec.protocol]}, one request at a time",
    }


def _trace_samples(trace_path: Path, results: dict) -> tuple[dict, list]:
    """batch -> per-execution ms from the trace, inside each size's measured window."""
    from schedsim.triton.trace_import import read_triton_trace

    out, warnings = {}, []
    if not trace_path.is_file():
        return out, [f"no trace file was written ({trace_path}); the table has means only"]
    for b, res in results.items():
        try:
            tt = read_triton_trace(trace_path, model=model_name(b))
        except InputError as exc:
            warnings.append(f"batch {b}: no per-batch samples from the trace ({exc}); mean only")
            continue
        warnings += tt.warnings
        start = tt.trace.meta["first_request_start_ns"] + (tt.trace.arrival_s * 1e9).round().astype(np.int64)
        inside = (start >= res.window_ns[0]) & (start <= res.window_ns[1]) & (tt.extra["execution"] >= 0)
        ex = tt.extra["execution"][inside]
        compute = (tt.extra["server_compute_input_us"] + tt.extra["server_compute_infer_us"]
                   + tt.extra["server_compute_output_us"])[inside]
        _, first = np.unique(ex, return_index=True)
        out[b] = compute[first] / 1e3
    return out, warnings


def _overhead_fit(results: dict) -> tuple[float, float, dict]:
    b = np.array(sorted(results), dtype=np.float64)
    outside = np.array([(results[k].cycle_ms - results[k].mean_ms) * 1e3 for k in sorted(results)])
    if len(b) >= 2:
        slope, icpt = np.polyfit(b - 1, outside, 1)
    else:
        slope, icpt = 0.0, float(outside[0])
    if icpt < 0:  # floor the constant, refit the slope through 0
        icpt = 0.0
        slope = float(np.dot(b - 1, outside) / np.dot(b - 1, b - 1)) if np.any(b > 1) else 0.0
    return max(float(icpt), 0.0), max(float(slope), 0.0), {
        "batch": [int(x) for x in b], "cycle_ms": [round(results[k].cycle_ms, 6) for k in sorted(results)],
        "compute_ms": [round(results[k].mean_ms, 6) for k in sorted(results)],
        "outside_compute_us": [round(float(x), 3) for x in outside]}


def run_triton_profile(spec: TritonProfileSpec, out: str | Path, note=print) -> TritonProfileOutcome:
    """Measure the table; write ``out`` (CSV), its sidecar and raw samples, and ``out.triton/``."""
    import pandas as pd

    from schedsim.cost.profile import SCHEMA, save_profile
    from schedsim.profiling.measure import machine_metadata, summarize
    from schedsim.triton.server import TritonServer, find_tritonserver

    spec.check()
    out = Path(out)
    raw = out.parent / f"{out.stem}.triton"
    raw.mkdir(parents=True, exist_ok=True)
    trace_path = raw / "trace.json"
    trace_path.unlink(missing_ok=True)
    started = datetime.now(timezone.utc)
    repo = write_profile_repository(spec, raw)
    _, kind, env = _parameters(spec)
    args = ("--trace-config", f"triton,file={trace_path}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"rate={2**31 - 1}", "--trace-config", "triton,log-frequency=0") if spec.trace else ()
    rng = np.random.default_rng(spec.seed)
    results: dict = {}
    zero: dict | None = None
    gaps = pairs = host = first_round = None
    warnings: list = []
    error: BaseException | None = None
    server = TritonServer(repo, raw / "tritonserver.log", find_tritonserver(), args=args, env=env,
                          ready_timeout_s=spec.ready_timeout_s)
    note(f"starting tritonserver ({server.install.source}) with {len(spec.batch_sizes)} models ...")
    with server:
        meta_server = _server_meta(server.url)
        note(f"ready after {server.started_s:.1f} s; Triton {meta_server.get('version', '?')} at {server.url}")
        try:
            for b in spec.batch_sizes:
                res = _measure_size(server, spec, b, rng, raw)
                results[b] = res
                note(f"batch {b:>4}: {res.executions} executions, compute {res.mean_ms:.3f} ms, "
                     f"cycle {res.cycle_ms:.3f} ms, client p50 {np.median(res.client_ms):.3f} ms"
                     + (f" (open loop at {res.open_rate_rps:,.0f} req/s; closed loop "
                        f"{sum(res.closed_compute_ms.values()):.3f} ms)" if res.closed_compute_ms else ""))
            if spec.zero_delay_requests:
                zero = _zero_delay(server, spec, rng, raw)
                note(f"zero delay: queue {zero['queue_us_at_zero_delay']:.1f} us, request path "
                     f"{zero['request_path_us']:.1f} us per request")
                if zero["request_path_us"] < 0:  # Triton's request time outlasted the client's latency
                    warnings.append(f"request path measured negative ({zero['request_path_us']:.1f} us): Triton's "
                                    "request time ended after the client had its answer; do not add it to predictions")
            if spec.wake_on():
                gaps = wake_profile.gap_schedule(spec.wake_requests, rng)
                note(f"wake curve: {gaps.size} lone requests after pauses of "
                     f"{', '.join(f'{g:g}' for g in wake_profile.GAPS_MS)} ms ...")
                set_model_trace(server.url, ZERO_DELAY_MODEL, 1)
                wake_profile.send_gapped(server.url, server.grpc_url, spec.protocol, ZERO_DELAY_MODEL, spec.seq_len,
                                         gaps, seed=int(rng.integers(2**31)))
                set_model_trace(server.url, ZERO_DELAY_MODEL, None)
            if spec.host_variation_s:
                note(f"host variation: 5 rounds of {spec.host_variation_s:g} s of lone requests through the server")
                host, first_round = host_record.one_server(server, spec, rng)
            if spec.pairs():
                note(f"pair grid over sizes {list(spec.pairs())} (two instances on one device) ...")
                pairs = measure_pair_grid(server, spec, results, spec.pairs(), lambda *a: drive_pair(server, spec, *a),
                                          model_name, note=note)
        except (KeyboardInterrupt, InputError) as exc:  # keep what was measured, marked partial
            error = exc
    if isinstance(error, InputError) and not results:
        raise error
    if first_round is not None and error is None:
        note(f"host variation: {spec.host_servers} fresh servers, one round of {spec.host_variation_s:g} s each ...")
        try:
            repo = write_zero_delay_model(spec, raw / "host_servers_repository")
            host = host_record.fresh_servers(spec, repo, host, first_round, raw, env, rng, note)
        except (KeyboardInterrupt, InputError, RuntimeError, OSError) as exc:
            warnings.append(f"host variation over fresh servers stopped ({exc}); the record is the table's server's")
    samples, more = _trace_samples(trace_path, results) if spec.trace else ({}, [])
    warnings += more
    if not results:
        return TritonProfileOutcome(None, 0, warnings + ["no batch size was measured, nothing written"])
    rows, raw_samples = [], {}
    for b, res in sorted(results.items()):
        row = {"batch": b, "seq_len": spec.seq_len, "latency_ms_mean": res.mean_ms, "n": res.executions}
        s = samples.get(b)
        if s is not None and s.size >= 2:
            st = summarize(s)
            row |= {k: st[k] for k in ("latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "latency_ms_std")}
            row["latency_ms_min"] = min(st["latency_ms_min"], res.mean_ms)
            row["latency_ms_max"] = max(st["latency_ms_max"], res.mean_ms, st["latency_ms_p99"])
            raw_samples[(b, spec.seq_len)] = s
            if st["unstable"]:
                warnings.append(f"batch {b} unstable: {st['unstable_reason']}")
        else:
            row |= {k: res.mean_ms for k in ("latency_ms_p50", "latency_ms_p90", "latency_ms_p99")}
            row["latency_ms_std"] = 0.0
        row |= {f"{k}_ms_mean": v for k, v in res.compute_ms.items()}
        if res.closed_compute_ms is not None:
            row |= {"closed_loop_ms_mean": sum(res.closed_compute_ms.values()), "open_rate_rps": res.open_rate_rps}
        row |= {"cycle_ms": res.cycle_ms, "client_ms_p50": float(np.median(res.client_ms)),
                "client_ms_p99": float(np.percentile(res.client_ms, 99)), "trace_samples": 0 if s is None else int(s.size)}
        rows.append(row)
        if res.other_sizes:
            warnings.append(f"batch {b}: Triton also formed other sizes during the stretch {res.other_sizes}")
        if res.executions < spec.batches:
            warnings.append(f"batch {b}: {res.executions} executions, fewer than the {spec.batches} asked")
        busy = res.queue_us_per_request / 1e3 / res.cycle_ms if res.cycle_ms > 0 else math.nan
        if busy < 0.25:
            warnings.append(f"batch {b}: requests waited {res.queue_us_per_request:.0f} us in the queue, under a quarter of a "
                            f"batch cycle ({res.cycle_ms * 1e3:.0f} us): the client may not have kept the server busy, "
                            "so the outside-compute time may include idling")
    if raw_samples and len(raw_samples) != len(rows):
        # The format needs samples for every cell or none: keep means for all.
        warnings.append(f"per-batch samples for {len(raw_samples)} of {len(rows)} sizes only; the samples file is left out")
        raw_samples = {}
    a, c, fit = _overhead_fit(results)
    wake = None
    if gaps is not None and error is None:
        try:
            from schedsim.triton.live import read_trace_file

            wake = wake_profile.wake_curve_from_trace(read_trace_file(trace_path), gaps,
                                                      wake_profile.busy_batch1_us(results, a))
        except InputError as exc:
            warnings.append(f"no wake curve: {exc}")
    complete = error is None and len(results) == len(spec.batch_sizes)
    if not complete:
        why = "interrupted" if isinstance(error, KeyboardInterrupt) else f"stopped by an error: {error}"
        warnings.insert(0, f"PARTIAL PROFILE: {why}; {len(results)} of {len(spec.batch_sizes)} sizes")
    machine = machine_metadata(probe_torch=(spec.device or "cpu") == "cuda")
    warnings += machine["warnings"]
    meta = {
        "schema": SCHEMA,
        "partial": not complete,
        "model": spec.model,
        "backend": "triton",
        "backend_version": meta_server.get("version"),
        "server": {"name": meta_server.get("name"), "version": meta_server.get("version"), **server.describe()},
        "precision": spec.precision or ("fp16" if spec.device == "cuda" else "fp32"),
        "cuda_graphs": bool(spec.cuda_graphs and spec.device == "cuda"),
        "instances": 1,
        "device": f"{spec.device or 'cpu'} ({kind})",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "timing": ("per batch size, a model with max_batch_size b and a 1 s queue delay driven closed loop by "
                   f"depth x b = {spec.depth} x b one-sample clients ({_CLIENTS[spec.protocol]}), so Triton runs "
                   f"full batches back to back, at least {spec.warmup_s:g} s of warm-up and {spec.min_time_s:g} s measured "
                   "per size; latency_ms_mean and n from the difference of Triton's batch_stats around the measured stretch "
                   "(compute_input + compute_infer + compute_output); spread from each traced execution's "
                   "COMPUTE_START -> COMPUTE_END (one request in b traced)"
                   + ("" if spec.arrivals == "closed" else
                      f"; then, per size, an open-loop Poisson stream at {spec.open_load:g} of its closed-loop "
                      "throughput (the live client, requests arriving while batches run): latency_ms_mean, n, the "
                      "stage means and the spread from that stretch, closed_loop_ms_mean the closed loop's")),
        "spread": ("per-batch samples from Triton's trace" if raw_samples else
                   "unknown: means only (percentiles = mean, std 0: the cost model takes each size's mean)"),
        "batches": spec.batches,
        "warmup_batches": spec.warmup_batches,
        "warmup_s": spec.warmup_s,
        "min_time_s": spec.min_time_s,
        "depth": spec.depth,
        "arrivals": spec.arrivals,
        **({"open_load": spec.open_load} if spec.arrivals == "open" else {}),
        "protocol": spec.protocol,
        "seed": spec.seed,
        "dispatch_overhead_us": round(a, 3),
        "dispatch_overhead_us_per_sample": round(c, 3),
        "dispatch_overhead": {
            "what": ("busy-server time per batch outside compute_input/infer/output: the client's batch cycle "
                     "minus Triton's compute per batch, fitted as a + c (b - 1); the cost model adds it to every "
                     "batch"), **fit},
        "triton_terms": zero,
        **({"wake_curve": wake} if wake else {}),
        **({"pair_slowdown": pairs} if pairs else {}),
        **({"host_variation": host} if host else {}),
        "triton_terms_use": ("recorded, not added by the simulator: queue_us_at_zero_delay is what the batcher "
                             "adds before an idle instance starts a batch at delay 0; request_path_us is the client's "
                             "latency beyond Triton's request time (compare client-side latency with the simulator's "
                             "server-side latency plus it); batch1_sequential_ms against the table's batch 1 shows "
                             "what idling between requests costs"),
        "raw_dir": raw.name,
        "machine": machine,
        "warnings": warnings,
    }
    save_profile(pd.DataFrame(rows), meta, out, raw_samples or None)
    return TritonProfileOutcome(out, len(rows), warnings)


def _server_meta(url: str) -> dict:
    from schedsim.triton.stats import fetch_json

    try:
        doc = fetch_json(f"http://{url}/v2")
    except InputError:
        return {}
    return doc if isinstance(doc, dict) else {}
