"""MLPerf LoadGen as an independent client: a schedsim policy plus a live engine as its SUT.

LoadGen (``pip install mlcommons-loadgen``, import ``mlperf_loadgen``) runs the Server
scenario: Poisson arrivals at ``target_qps``, latency from each query's scheduled time,
a p99 bound. :func:`run_loadgen` serves its queries through a schedsim policy and one
engine, and reads the measured side from LoadGen's own ``mlperf_log_summary.txt``;
:func:`predict_loadgen` simulates a Poisson trace at the same QPS and reports the same keys.

The SUT is a small dispatcher thread, not :func:`schedsim.live.driver.run_live`: that driver
replays a trace whose arrival times are known in advance, while LoadGen decides them.
The policy sees a request table of ``capacity`` rows whose ``arrival_ns`` column is filled
in as queries are issued (the policy only reads rows it has been told arrived). Hooks run
in the simulator's order: completions, then arrivals, then one ``decide``. The engine runs
on the dispatcher thread (one instance); queries issued meanwhile wait for the next step.

The arrival times returned are the SUT's clock when LoadGen called ``issue_queries``
(LoadGen's scheduled times are not in its summary or detail log); the prediction uses a
fresh Poisson process at the same rate, not those times.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np

from schedsim.core.metrics import summarize
from schedsim.core.policy import NEVER, Requests
from schedsim.core.results import ask
from schedsim.core.simulate import simulate
from schedsim.traces.generate import poisson
from schedsim.traces.table import Trace

SUMMARY_PERCENTILES = {"p50_ms": "50.00", "p90_ms": "90.00", "p95_ms": "95.00", "p99_ms": "99.00",
                       "p999_ms": "99.90"}
"""Keys shared with :data:`schedsim.core.metrics.PERCENTILES` -> LoadGen's percentile labels."""


def _table(capacity: int, seq_len: int) -> Requests:
    zeros = np.zeros(capacity, np.int64)
    return Requests(np.zeros(capacity, np.int64), np.ones(capacity, np.int32),
                    np.full(capacity, seq_len, np.int32), np.zeros(capacity, np.int16),
                    zeros, np.zeros(capacity, np.int32), np.zeros(capacity, np.int32))


class _Dispatcher:
    """Queries in, policy decisions, engine calls, ``QuerySamplesComplete`` out."""

    def __init__(self, policy, engine, lg, *, capacity: int, seq_len: int, seed: int):
        self.policy, self.engine, self.lg = policy, engine, lg
        self.seq_len = seq_len
        self.req = _table(capacity, seq_len)
        self.ids = np.zeros(capacity, np.uint64)      # LoadGen's query id per row
        self.issued = 0                               # rows [0, issued) were issued by LoadGen
        self.delivered = 0                            # rows [0, delivered) were told to the policy
        self.pool = np.random.default_rng(seed).integers(1000, int(getattr(engine, "vocab", None) or 30522),
                                                         size=(256, seq_len), dtype=np.int64)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = False
        self.t0 = time.perf_counter_ns()
        self.batches: list[tuple[int, int, int]] = []  # (start ns, end ns, samples)
        self.error: BaseException | None = None
        policy.reset(self.req, 1)

    def now(self) -> int:
        return time.perf_counter_ns() - self.t0

    def issue(self, samples) -> None:  # LoadGen's thread
        with self.lock:
            now = self.now()
            for s in samples:
                if self.issued >= len(self.ids):
                    raise RuntimeError("LoadGen issued more queries than the SUT's capacity")
                self.req.arrival_ns[self.issued] = now
                self.ids[self.issued] = s.id
                self.issued += 1
        self.wake.set()

    def loop(self) -> None:
        timer = NEVER
        try:
            while True:
                wait = None if timer == NEVER else max(timer - self.now(), 0) / 1e9
                self.wake.wait(wait)
                self.wake.clear()
                if self.stop:
                    return
                launch = None
                with self.lock:
                    now = self.now()
                    if self.issued > self.delivered:
                        first, self.delivered = self.delivered, self.issued
                        self.policy.on_arrivals(now, first, self.delivered)
                    decision = ask(self.policy, now, [0])
                    timer = decision.wake_at_ns
                    if decision.rejects:
                        for r in decision.rejects:  # a rejected query is answered with no data
                            self._complete(np.asarray(r.rows))
                    if decision.launches:
                        launch = decision.launches[0]
                if launch is not None:
                    rows = np.arange(launch.rows.start, launch.rows.stop) if type(launch.rows) is range \
                        else np.asarray(launch.rows)
                    b = len(rows)
                    buf = self.engine.host_input(b, self.seq_len) if hasattr(self.engine, "host_input") \
                        else np.empty((b, self.seq_len), np.int64)
                    buf[...] = self.pool[rows % len(self.pool)]
                    start = self.now()
                    self.engine.infer(b, self.seq_len, buf)
                    end = self.now()
                    self.batches.append((start, end, b))
                    self._complete(rows)
                    with self.lock:
                        self.policy.on_batch_done(end, 0, launch.rows)
                    self.wake.set()  # decide again at once: the completion's step
        except BaseException as exc:  # noqa: BLE001 - reported by run_loadgen
            self.error = exc

    def _complete(self, rows: np.ndarray) -> None:
        lg = self.lg
        lg.QuerySamplesComplete([lg.QuerySampleResponse(int(self.ids[r]), 0, 0) for r in rows.tolist()])


def parse_summary(path) -> dict:
    """LoadGen's mlperf_log_summary.txt -> schedsim summary keys (ms, rps) plus ``valid``."""
    text = Path(path).read_text()

    def num(label):
        m = re.search(rf"^{re.escape(label)}\s*:\s*([-0-9.e+]+)", text, re.M)
        return float(m.group(1)) if m else float("nan")

    out = {"valid": bool(re.search(r"^Result is\s*:\s*VALID", text, re.M)),
           "scheduled_qps": num("Scheduled samples per second"),
           "throughput_rps": num("Completed samples per second"),
           "mean_ms": num("Mean latency (ns)") / 1e6, "max_ms": num("Max latency (ns)") / 1e6,
           "min_ms": num("Min latency (ns)") / 1e6}
    for key, label in SUMMARY_PERCENTILES.items():
        out[key] = num(f"{label} percentile latency (ns)") / 1e6
    m = re.search(r"^Result is\s*:\s*(\w+)", text, re.M)
    out["result"] = m.group(1) if m else "unknown"
    return out


def run_loadgen(qps: float, duration_s: float, policy, engine_factory, *, seed: int = 0, out_dir,
                seq_len: int = 128, target_latency_ms: float = 100.0, capacity: int | None = None) -> dict:
    """Run LoadGen's Server scenario at ``qps`` for ``duration_s`` against ``policy`` + engine.

    ``engine_factory()`` returns a context manager yielding the engine. Returns LoadGen's
    summary (:func:`parse_summary`), ``completed`` (queries answered), ``batches``,
    ``mean_batch_size`` and ``arrival_s``: when each query reached the SUT (not LoadGen's
    scheduled times, which its logs do not give).
    """
    import mlperf_loadgen as lg  # lazy: an optional package (pip install mlcommons-loadgen)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = int(qps * duration_s)
    capacity = capacity or int(expected * 2 + 1000)
    with engine_factory() as engine:
        largest = policy.max_batch_samples() or 1
        warm = np.ones((largest, seq_len), np.int64)
        for b in range(1, largest + 1):
            engine.infer(b, seq_len, warm[:b].copy())
        d = _Dispatcher(policy, engine, lg, capacity=capacity, seq_len=seq_len, seed=seed)
        settings = lg.TestSettings()
        settings.scenario = lg.TestScenario.Server
        settings.mode = lg.TestMode.PerformanceOnly
        settings.server_target_qps = float(qps)
        settings.server_target_latency_ns = int(target_latency_ms * 1e6)
        settings.min_duration_ms = int(duration_s * 1000)
        settings.min_query_count = max(expected // 2, 1)
        settings.max_query_count = capacity
        settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = int(seed)
        log = lg.LogSettings()
        log.log_output.outdir = str(out_dir)
        log.log_output.copy_summary_to_stdout = False
        log.enable_trace = False
        thread = threading.Thread(target=d.loop, name="schedsim-loadgen", daemon=True)
        thread.start()
        sut = lg.ConstructSUT(d.issue, lambda: None)
        qsl = lg.ConstructQSL(1024, 1024, lambda s: None, lambda s: None)
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            d.stop = True
            d.wake.set()
            thread.join(timeout=30)
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
    if d.error is not None:
        raise d.error
    out = parse_summary(out_dir / "mlperf_log_summary.txt")
    sizes = np.array([b[2] for b in d.batches])
    out.update(completed=int(d.issued), batches=int(sizes.size),
               mean_batch_size=float(sizes.mean()) if sizes.size else float("nan"),
               arrival_s=(d.req.arrival_ns[:d.issued] - (d.req.arrival_ns[0] if d.issued else 0)) / 1e9,
               arrival_times_source="SUT clock at issue_queries")
    return out


def predict_loadgen(qps: float, duration_s: float, policy_factory, cost, seed: int = 0,
                    seq_len: int = 128) -> dict:
    """The simulator's prediction for :func:`run_loadgen`: a Poisson trace at ``qps``, same keys."""
    arrivals = poisson(qps, rng=np.random.default_rng(seed), duration_s=duration_s)
    trace = Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), seq_len))
    s = summarize(simulate(Requests.from_trace(trace), policy_factory(), cost, seed=seed))
    keys = ("throughput_rps", "mean_ms", "max_ms", *SUMMARY_PERCENTILES, "mean_batch_size", "completed")
    return {"scheduled_qps": len(arrivals) / duration_s, **{k: s[k] for k in keys}}
