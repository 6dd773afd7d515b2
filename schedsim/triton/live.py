"""``schedsim live --backend triton``: replay a trace against a real Triton server.

With no ``--triton-url``, schedsim writes a model repository whose config.pbtxt expresses
the policy flags (:mod:`schedsim.triton.repository`) around a Python-backend model of a
builtin encoder (:mod:`schedsim.triton.python_model`), starts ``tritonserver``
(:mod:`schedsim.triton.server`), drives the trace open loop (:mod:`schedsim.triton.client`)
and stops the server. With ``--triton-url HOST:PORT --triton-model NAME`` it drives a
server the user runs (any backend); nothing is written or started.

Server-side times come from Triton's statistics endpoint, read before the run, at the end
of ``--warmup-s`` and after the run (``DIR/triton_stats.json``: per batch size, executions
and compute_input/infer/output time; queue and compute totals); the summary's batches are
those between the warm-up's end and the run's end. That is always done. Per-request server
timestamps come from Triton's trace API only when asked (``--triton-trace-rate N``: one request in N):
tracing every request crashed a GPU server under load, so it is off by default.

Outputs are those of ``schedsim live`` (requests.csv, summary.json with the same keys, so
``schedsim validate`` works), plus triton_requests.csv (per request: scheduled, sent and
answered times, HTTP status, error and, when traced, Triton's timestamps), triton_stats.json
and live.json. In requests.csv ``start_s`` is when the client sent the request, so
``queue_ms`` there is the client's lateness; the server's queue time is in
``summary["mean_queue_ms"]`` (Triton's, from its statistics). Batch sizes are Triton's
(its batch_stats), not per request. If the server fails to start, dies during the run or
the client fails, every measured request is written (marked) and a one-line error follows.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.triton.execution_log import PARAMETER as LOG_PARAMETER
from schedsim.triton.execution_log import per_request, read_execution_log, server_side_summary
from schedsim.triton.server import ServerError

DEFAULT_MODEL_NAME = "schedsim_encoder"
TRACE_TIMESTAMPS = ("HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
                    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "HTTP_SEND_END")
"""Triton's per-request trace timestamps kept in triton_requests.csv (level TIMESTAMPS)."""


@dataclass(frozen=True)
class TritonLiveSpec:
    """Everything ``schedsim live --backend triton`` needs besides the policy and trace (``run``)."""

    run: object
    """A :class:`schedsim.run.runner.RunSpec`: trace, policy, params, instances, warm-up, out."""
    model: str = "builtin:bert-tiny"
    """builtin:bert-tiny or builtin:bert-base (a server schedsim starts)."""
    device: str | None = None
    """cpu (KIND_CPU, numpy engine) or cuda (KIND_GPU, torch with CUDA graphs); None = cpu."""
    precision: str | None = None
    """cuda: fp16, bf16 or fp32 (default fp16)."""
    cuda_graphs: bool = True
    """cuda: one CUDA graph per batch size."""
    seq_len: int = 128
    """seq_len of requests whose trace gives none."""
    seed: int = 0
    """Seed of the model weights and the token ids."""
    threads: int = 1
    """cpu: BLAS threads per model instance."""
    time_limit_s: float | None = None
    """Stop sending this long after the trace start (the outputs are marked partial)."""
    url: str | None = None
    """HOST:PORT of a running server's HTTP endpoint; None = start one."""
    model_name: str | None = None
    """The model to drive on that server (required with url); default name otherwise."""
    trace_rate: int | None = None
    """Trace one request in this many with Triton's trace API (a server schedsim starts); None = off."""
    processes: int = 1
    """Client processes (one asyncio loop each)."""
    execution_log: Path | None = None
    """With url: the folder where that server's schedsim model writes its execution log
    (:mod:`schedsim.triton.execution_log`); a server schedsim starts writes OUT/executions."""
    ready_timeout_s: float = 300.0
    """How long the server may take to load the model."""


def _check(spec: TritonLiveSpec) -> None:
    if spec.run.out is None:
        raise InputError("--out: a live run needs an output directory")
    if spec.device not in (None, "cpu", "cuda"):
        raise InputError(f"--device: {spec.device!r} is not valid; expected cuda or cpu")
    if spec.url is not None:
        if not spec.model_name:
            raise InputError("--triton-url: give the model to drive with --triton-model NAME")
        if spec.url.count(":") != 1 or not spec.url.rsplit(":", 1)[1].isdigit():
            raise InputError(f"--triton-url: {spec.url!r} is not HOST:PORT (the server's HTTP endpoint)")
        if spec.trace_rate:
            raise InputError("--triton-trace-rate: applies to a server schedsim starts, not to --triton-url")
    elif not spec.model.startswith("builtin:") or spec.model.partition(":")[2] not in ("bert-tiny", "bert-base"):
        raise InputError(f"--model {spec.model}: --backend triton serves builtin:bert-tiny or builtin:bert-base; "
                         "for another model, run it in your own server and use --triton-url/--triton-model")
    if spec.trace_rate is not None and spec.trace_rate < 1:
        raise InputError(f"--triton-trace-rate: {spec.trace_rate} is not valid; expected an integer >= 1")
    if spec.processes < 1:
        raise InputError(f"--client-processes: {spec.processes} is not valid; expected an integer >= 1")
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise InputError(f"--time-limit-s: {spec.time_limit_s} is not valid; expected a number > 0")
    if spec.seq_len < 1:
        raise InputError(f"--seq-len: {spec.seq_len} is not valid; expected an integer >= 1")


def _raw_stats(url: str, name: str) -> dict | None:
    """The server's statistics answer for the model now (raw JSON); None when it does not answer."""
    from schedsim.triton.stats import fetch_json, stats_url

    try:
        return fetch_json(stats_url(url, name))
    except InputError:
        return None


def stats_delta(before: dict | None, after: dict | None, name: str):
    """What the server did between two raw statistics answers, as a
    :class:`schedsim.triton.stats.ModelStats` (None without the second one)."""
    from schedsim.triton.stats import parse_stats, select

    if after is None:
        return None
    now = select(parse_stats(after, "statistics after the run"), "statistics after the run", name)
    if before is None:
        return now
    return now.since(select(parse_stats(before, "statistics before the run"), "statistics before the run", name))


def delta_json(delta) -> dict | None:
    """A ModelStats difference as JSON: counts and totals per request stage and per batch size."""
    if delta is None:
        return None

    def pair(c_ns):
        return {"count": int(c_ns[0]), "ns": int(c_ns[1])}

    return {"inference_count": delta.inference_count, "execution_count": delta.execution_count,
            "inference_stats": {k: pair(v) for k, v in delta.requests.items()},
            "batch_stats": {int(b): {k: pair(v) for k, v in st.items()} for b, st in delta.batches.items()}}


def batch_histogram(delta) -> dict[int, int]:
    """Executions per batch size (samples) of a statistics difference."""
    if delta is None:
        return {}
    return {int(b): delta.executions(b) for b in sorted(delta.batches) if delta.executions(b)}


def _trace_args(path: Path, rate: int) -> tuple[str, ...]:
    return ("--trace-config", f"triton,file={path}", "--trace-config", "triton,log-frequency=0",
            "--trace-config", f"rate={rate}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "count=-1")


def read_trace_file(path: Path) -> dict[str, dict[str, int]]:
    """request id -> {timestamp name: ns} from a Triton trace file (TIMESTAMPS level)."""
    try:
        entries = json.loads(Path(path).read_text() or "[]")
    except (OSError, ValueError):
        return {}
    by_id: dict = {}
    for e in entries:
        rec = by_id.setdefault(e.get("id"), {"stamps": {}})
        if "request_id" in e:
            rec["request_id"] = str(e["request_id"])
        for t in e.get("timestamps", []):
            rec["stamps"].setdefault(t["name"], int(t["ns"]))
    return {r["request_id"]: r["stamps"] for r in by_id.values() if "request_id" in r}


def _statuses(record, keep: int):
    from schedsim.core.results import COMPLETED, FAILED, QUEUED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT

    status = np.full(keep, QUEUED, np.int8)
    answered = record.answered_ns[:keep] >= 0
    ok = answered & (record.http_status[:keep] == 200)
    status[answered & ~ok] = FAILED
    status[ok] = COMPLETED
    for i in np.flatnonzero(answered & ~ok).tolist():
        text = record.error[i].lower()
        if "exceeds maximum queue size" in text:
            status[i] = REJECTED_QUEUE_FULL
        elif "timeout" in text and "request" in text and record.http_status[i] != 0:
            status[i] = REJECTED_TIMEOUT
    return status


def _model_params(spec: TritonLiveSpec, seq_lens: list[int]) -> tuple[dict, str, dict]:
    """(config parameters, instance kind, server environment) for the builtin model."""
    device = spec.device or "cpu"
    name = spec.model.partition(":")[2]
    params = {"model": name, "seed": spec.seed, "seq_lens": ",".join(map(str, seq_lens))}
    if device == "cpu":
        params["engine"] = "numpy"
        threads = str(spec.threads)
        env = {"OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        return params, "KIND_CPU", env
    if spec.precision not in (None, "fp16", "bf16", "fp32"):
        raise InputError(f"--precision: {spec.precision!r} is not valid; expected fp16, bf16 or fp32")
    params |= {"engine": "torch", "precision": spec.precision or "fp16", "cuda_graphs": int(spec.cuda_graphs)}
    return params, "KIND_GPU", {}


def execute_live_triton(spec: TritonLiveSpec):
    """Run ``schedsim live --backend triton``: returns (title, summary, written paths)."""
    import contextlib

    from schedsim.core.metrics import summarize
    from schedsim.core.results import COMPLETED, SimResult
    from schedsim.files import write_columns_csv, write_json
    from schedsim.run.report import write_outputs
    from schedsim.run.runner import load_inputs, policy_config
    from schedsim.triton.client import drive
    from schedsim.triton.repository import model_config, triton_prefetches, write_repository
    from schedsim.triton.server import TritonServer, find_tritonserver

    _check(spec)
    inputs = load_inputs(spec.run)
    requests = inputs.requests
    out = Path(spec.run.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)  # an old summary must not vouch for new files
    seq = np.where(requests.seq_len > 0, requests.seq_len, spec.seq_len).astype(np.int64)
    seq_lens = sorted({int(s) for s in np.unique(seq)}) or [spec.seq_len]
    name = spec.model_name or DEFAULT_MODEL_NAME
    info: dict = {"backend": "triton", "model": spec.model if spec.url is None else name}
    server = None
    trace_path = out / "triton_trace.json"
    trace_path.unlink(missing_ok=True)
    if spec.url is None:
        largest = int(requests.samples.max()) if len(requests) else 1
        if seq_lens and max(seq_lens) > 512:
            raise InputError(f"--model {spec.model} takes seq_len up to 512, but the trace has seq_len {max(seq_lens)}")
        params, kind, env = _model_params(spec, seq_lens)
        log_dir = out / "executions"
        if log_dir.is_dir():  # a run owns its directory: no lines from an earlier run
            for old in log_dir.glob("*.log"):
                old.unlink()
        params[LOG_PARAMETER] = str(log_dir.resolve())
        hidden = 768 if spec.model.endswith("bert-base") else 128
        cfg = model_config(name, policy=spec.run.policy, params=inputs.params, instances=inputs.instances,
                           kind=kind, max_batch_size=largest, hidden=hidden, parameters=params)
        repo = out / "model_repository"
        write_repository(repo, name, cfg)
        args = _trace_args(trace_path, spec.trace_rate) if spec.trace_rate else ()
        server = TritonServer(repo, out / "tritonserver.log", find_tritonserver(), args=args,
                              ready_timeout_s=spec.ready_timeout_s, env=env)
        info |= {"device": spec.device or "cpu", "instance_kind": kind, "model_parameters": params,
                 "repository": str(repo)}
    with contextlib.ExitStack() as stack:
        if server is not None:
            stack.enter_context(server)  # ServerError (one line, names the log) if it does not start
            url = server.url
        else:
            url = spec.url
            from schedsim.triton.stats import fetch_json, server_base

            try:
                fetch_json(f"{server_base(url)}/v2/models/{name}")
            except InputError as exc:
                raise ServerError(f"--triton-url {url} --triton-model {name}: {exc}") from None
        model_cfg = _model_config(url, name)
        stats: dict = {}
        stopped: dict = {}
        started_ns = [0]

        def before_start():
            stats["start"] = stats["before"] = _raw_stats(url, name)
            started_ns[0] = time.monotonic_ns()

        def warmup_over():  # the batches formed after this are the ones summarised
            stats["before"] = _raw_stats(url, name)

        def should_stop():
            if server is not None and not server.alive():
                stopped.setdefault("reason", "server died")
            elif spec.time_limit_s is not None and started_ns[0] and \
                    (time.monotonic_ns() - started_ns[0]) / 1e9 > spec.time_limit_s:
                stopped.setdefault("reason", "time limit")
            if stopped:
                stopped.setdefault("at_ns", time.monotonic_ns())
            return bool(stopped)

        record = drive(url, name, requests.arrival_ns, seq, processes=spec.processes,
                       priority=requests.priority if requests.priority.any() else None,
                       timeout_us=(requests.timeout_ns // 1000) if requests.timeout_ns.any() else None,
                       seed=spec.seed, should_stop=should_stop, before_start=before_start,
                       at=(int(spec.run.warmup_s * 1e9), warmup_over) if spec.run.warmup_s > 0 else None)
        died = server is not None and not server.alive()
        placement = server.placement() if server is not None and not died else None
        stats["after"] = None if died else _raw_stats(url, name)
        death = server._died("during the run") if died else None
    # The server is stopped here (its trace file is complete).
    server_info = server.describe() | {"placement": placement} if server is not None else {"url": url}
    n = len(requests)
    partial_reason = stopped.get("reason") or ("client failed: " + record.failures[0] if record.failures else None)
    keep = n
    if stopped:
        keep = int(requests.arrival_ns.searchsorted(stopped["at_ns"] - record.t0_ns, side="right"))
    t0 = record.t0_ns
    status = _statuses(record, keep)
    sent, answered = record.sent_ns[:keep], record.answered_ns[:keep]
    start_ns = np.where(sent >= 0, sent - t0, -1)
    end_ns = np.where(answered >= 0, answered - t0, -1)
    delta = stats_delta(stats.get("before"), stats.get("after"), name)
    hist = batch_histogram(delta)
    sizes = np.repeat(np.array(list(hist), np.int32), list(hist.values())) if hist else np.zeros(0, np.int32)
    req = requests.head(keep) if keep < n else requests
    zeros = np.zeros(len(sizes), np.int64)
    done = status == COMPLETED
    result = SimResult(req, start_ns, end_ns, np.zeros(keep, np.int32), np.zeros(keep, np.int16), status,
                       zeros, zeros, zeros.astype(np.int16), sizes, sizes, inputs.instances, 0)
    summary = summarize(result, spec.run.warmup_s)
    span_s = (end_ns[done].max() - req.arrival_ns[done].min()) / 1e9 if done.any() else float("nan")
    q_count, q_ns = delta.requests.get("queue", (0, 0)) if delta else (0, 0)
    compute_ns = sum(ns for st in delta.batches.values() for _, ns in st.values()) if delta else 0
    summary["mean_queue_ms"] = q_ns / q_count / 1e6 if q_count else float("nan")
    summary["batches"] = int(sum(hist.values()))
    summary["mean_batch_size"] = float(sizes.mean()) if sizes.size else float("nan")
    summary["batch_size_histogram"] = hist
    summary["utilization"] = ([compute_ns / 1e9 / span_s / inputs.instances] * inputs.instances
                              if span_s == span_s and span_s > 0 else [float("nan")] * inputs.instances)
    late_us = (sent[sent >= 0] - record.scheduled_ns[:keep][sent >= 0]) / 1e3
    summary["config"] = policy_config(spec.run, inputs) | {
        "driver": "live", "backend": "triton", "model": info["model"], "device": info.get("device"),
        "seq_len": spec.seq_len, "seed": spec.seed, "time_limit_s": spec.time_limit_s,
        "client_processes": record.processes, "triton_url": spec.url, "triton_model": name,
        "triton_trace_rate": spec.trace_rate,
        "triton_prefetches": triton_prefetches(inputs.params) if spec.run.policy == "dynamic" else False,
        "server_side_times": "statistics" + (f", trace 1/{spec.trace_rate}" if spec.trace_rate else ""),
    }
    summary["partial"] = partial_reason is not None
    if partial_reason:
        summary["partial_reason"] = partial_reason
    summary["live"] = {
        "issue_lateness_us": _stats(late_us), "timer_lateness_us": {}, "dispatch_us": {},
        "completion_gap_us": {}, "engine_host_ms": _per_execution_ms(delta, "compute_infer"),
        "engine_gpu_ms": {}, "failed_batches": int(delta.requests.get("fail", (0, 0))[0]) if delta else 0,
        "client_lateness_us": _stats(late_us),
        "server_queue_ms_mean": summary["mean_queue_ms"],
        "request_errors": int(((answered >= 0) & (record.http_status[:keep] != 200)).sum()),
    }
    written = []
    # Per-request client record (and Triton's timestamps for traced requests), then stats.
    traced = read_trace_file(trace_path) if spec.trace_rate else {}
    columns = {"request_id": inputs.trace.request_id[:keep],
               "scheduled_s": (record.scheduled_ns[:keep] - t0) / 1e9,
               "sent_s": np.where(sent >= 0, (sent - t0) / 1e9, np.nan),
               "answered_s": np.where(answered >= 0, (answered - t0) / 1e9, np.nan),
               "lateness_us": np.where(sent >= 0, (sent - record.scheduled_ns[:keep]) / 1e3, np.nan),
               "latency_ms": np.where(answered >= 0, (answered - record.scheduled_ns[:keep]) / 1e6, np.nan),
               "http_status": record.http_status[:keep],
               "status": [_status_name(s) for s in status.tolist()], "error": record.error[:keep]}
    log_dir = spec.execution_log if spec.url is not None else out / "executions"
    if log_dir is not None and Path(log_dir).is_dir():
        executions = read_execution_log(log_dir, since_ns=t0)
        model_cols = per_request(executions, range(keep), t0)  # the client sends each row's index as its id
        columns |= model_cols
        measured = done & (req.arrival_ns >= int(spec.run.warmup_s * 1e9))
        summary["server_side"] = server_side_summary(columns["sent_s"], model_cols["model_end_s"], measured)
        summary["config"]["server_side_times"] += ", the model's execution log"
    for stamp in TRACE_TIMESTAMPS if spec.trace_rate else ():
        columns[f"server_{stamp.lower()}_s"] = np.array(
            [(traced[str(i)][stamp] - t0) / 1e9 if str(i) in traced and stamp in traced[str(i)] else np.nan
             for i in range(keep)])
    path = out / "triton_requests.csv"
    write_columns_csv(path, columns, list(columns))
    written.append(path)
    path = out / "triton_stats.json"
    write_json(path, {"model": name, "url": url, "start": stats.get("start"), "before": stats.get("before"),
                      "after": stats.get("after"), "warmup_s": spec.run.warmup_s,
                      "delta": delta_json(delta), "model_config": model_cfg,
                      "traced_requests": len(traced) if spec.trace_rate else None})
    written.append(path)
    path = out / "live.json"
    write_json(path, info | {"server": server_info, "client": {"processes": record.processes,
                                                               "failures": record.failures,
                                                               "t0_monotonic_ns": t0}})
    written.append(path)
    written += write_outputs(out, result, inputs.trace.request_id[:keep], summary, spec.run.plot, spec.run.warmup_s)
    if death is not None:
        raise ServerError(f"{death}; {keep:,} requests written to {out} (status marked)")
    if record.failures:
        raise ServerError(f"the client failed ({record.failures[0]}); {keep:,} requests written to {out} "
                          "(status marked)")
    title = (f"live {spec.run.policy} through Triton on {Path(spec.run.trace).name}: {keep:,} requests, "
             f"{inputs.instances} instance{'s' if inputs.instances > 1 else ''}, {info['model']}"
             + (f" on {info['device']}" if info.get("device") else f" at {url}")
             + (f" (PARTIAL: {partial_reason})" if partial_reason else ""))
    return title, summary, written


def _status_name(code: int) -> str:
    from schedsim.core.results import STATUS_NAMES

    return STATUS_NAMES[code]


def _stats(x) -> dict:
    x = np.asarray(x, np.float64)
    if not x.size:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p99": float(np.percentile(x, 99)), "max": float(x.max())}


def _per_execution_ms(delta, stage: str) -> dict:
    if delta is None or not delta.batches:
        return {"n": 0}
    count = sum(st.get(stage, (0, 0))[0] for st in delta.batches.values())
    ns = sum(st.get(stage, (0, 0))[1] for st in delta.batches.values())
    return {"n": int(count), "mean": ns / count / 1e6 if count else float("nan")}


def _model_config(url: str, name: str) -> dict | None:
    from schedsim.triton.stats import fetch_json, server_base

    try:
        return fetch_json(f"{server_base(url)}/v2/models/{name}/config")
    except InputError:
        return None
