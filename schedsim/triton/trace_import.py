"""Triton's trace files (``--trace-config level=TIMESTAMPS``) into schedsim arrival traces.

Triton writes a JSON array of records. Since 2.2x each record holds one thing about one
trace ``id``: ``{"id", "model_name", "model_version"[, "request_id", "parent_id"]}`` or
``{"id", "timestamps": [{"name", "ns"}]}`` (one timestamp a record) or, at level TENSORS,
``{"id", "activity", "tensor"}``; older servers wrote one record per trace with every
timestamp in it and lower-case names ("queue start", "request handler start"). Both are
read. Timestamps are the server's steady clock in nanoseconds: REQUEST_START,
QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END,
REQUEST_END, and the frontend's (HTTP_RECV_START, GRPC_WAITREAD_END, ...).

With ``log-frequency`` N the server writes ``FILE.0``, ``FILE.1``, ...; pass them all. A
file whose server did not shut down cleanly may lack its closing ``]`` or end inside a
record: what was complete is read and a warning says what was not.

The arrival trace has ``arrival_s`` from REQUEST_START (relative to the first),
``request_id`` = the trace id, and the server's own account of each request as extra
columns (microseconds; empty where a timestamp is missing), which ``load_trace`` ignores:

==========================  =================================================
server_queue_us             QUEUE_START -> COMPUTE_START
server_compute_input_us     COMPUTE_START -> COMPUTE_INPUT_END
server_compute_infer_us     COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START
server_compute_output_us    COMPUTE_OUTPUT_START -> COMPUTE_END
server_latency_us           REQUEST_START -> REQUEST_END
execution                   the execution (batch) the request ran in: requests
                            with the same COMPUTE_START and COMPUTE_END, numbered
                            in order of COMPUTE_START from 0
execution_requests          requests in that execution
==========================  =================================================

TIMESTAMPS traces carry no tensor shapes, so every request counts 1 sample; and a trace
sampled at ``rate`` N > 1 holds one request in N, so its arrivals are a thinned stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.traces.table import Trace

STAGES = {
    "server_queue_us": ("QUEUE_START", "COMPUTE_START"),
    "server_compute_input_us": ("COMPUTE_START", "COMPUTE_INPUT_END"),
    "server_compute_infer_us": ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    "server_compute_output_us": ("COMPUTE_OUTPUT_START", "COMPUTE_END"),
    "server_latency_us": ("REQUEST_START", "REQUEST_END"),
}
"""Extra column -> (from, to) timestamp names."""
EXTRA_COLUMNS = (*STAGES, "execution", "execution_requests")

_ALIASES = {"REQUEST_HANDLER_START": "REQUEST_START", "REQUEST_HANDLER_END": "REQUEST_END"}


@dataclass
class _Request:
    first: str
    """Where its first record is, for messages (FILE:LINE: record N)."""
    model: str | None = None
    version: str | None = None
    parent: int | None = None
    stamps: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TritonTrace:
    """Requests read from Triton trace files, in arrival order."""

    trace: Trace
    """The arrival trace (request_id = Triton's trace id)."""
    extra: dict
    """Column name -> float64 array (int64 for the execution columns), one entry per row, see the module doc."""
    warnings: list
    """What could not be read, said once each."""


def _records(path: Path):
    """Yield (location, record) for each element of the JSON array in ``path``; tolerate a
    missing ``]`` and a cut-off last record (warned), refuse anything else malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    dec = json.JSONDecoder()
    n = len(text)

    def skip(i):
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    seen = [0, 1]  # (offset, its line): records come in order, so count each newline once

    def line(i):
        if i < seen[0]:
            return text.count("\n", 0, i) + 1
        seen[1] += text.count("\n", seen[0], i)
        seen[0] = i
        return seen[1]

    i = skip(0)
    if i == n:
        raise InputError(f"{path}: empty file (expected Triton's JSON trace array)")
    if text[i] != "[":
        raise InputError(f"{path}:{line(i)}: not a Triton trace file: expected a JSON array '[', found {text[i]!r}")
    i = skip(i + 1)
    k = 0
    while True:
        if i == n:
            yield None, f"{path}: the file ends without ']' after record {k} (the server did not shut down cleanly?)"
            return
        if text[i] == "]" and k == 0:
            i += 1
            break
        try:
            rec, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            # Cut off: the decoder ran out of text (an unterminated string runs to the end).
            runs_out = (text.find('"', e.pos + 1) == -1 if e.msg.startswith("Unterminated string")
                        else skip(e.pos) == n)
            if runs_out:
                yield None, f"{path}:{line(i)}: record {k} is cut off at the end of the file; read the {k} before it"
                return
            raise InputError(f"{path}:{e.lineno}: invalid JSON in record {k}: {e.msg} (column {e.colno})") from None
        yield f"{path}:{line(i)}: record {k}", rec
        k += 1
        i = skip(j)
        if i == n:
            yield None, f"{path}: the file ends without ']' after record {k} (the server did not shut down cleanly?)"
            return
        if text[i] == ",":
            i = skip(i + 1)
            continue
        if text[i] == "]":
            i += 1
            break
        raise InputError(f"{path}:{line(i)}: expected ',' or ']' after record {k - 1}, found {text[i]!r}")
    if skip(i) != n:
        raise InputError(f"{path}:{line(skip(i))}: unexpected text after the closing ']'")


def _int(value, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{where}: {what}: {value!r} is not an integer >= 0")
    return value


def read_triton_trace(paths, model: str | None = None) -> TritonTrace:
    """Read one or more Triton trace files into an arrival trace (see the module doc)."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise InputError("no trace file given")
    requests: dict[int, _Request] = {}
    warnings = []
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path}: no such trace file")
        for where, rec in _records(path):
            if where is None:
                warnings.append(rec)
                continue
            if not isinstance(rec, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            if "id" not in rec:
                raise InputError(f"{where}: no 'id' (every record of a Triton trace names its trace id)")
            tid = _int(rec["id"], where, "id")
            req = requests.get(tid)
            if req is None:
                req = requests[tid] = _Request(where)
            if "model_name" in rec:
                name = rec["model_name"]
                if not isinstance(name, str) or not name:
                    raise InputError(f"{where}: model_name: {name!r} is not a model name")
                if req.model is not None and req.model != name:
                    raise InputError(f"{where}: trace id {tid} is for model {req.model!r} at {req.first}, "
                                     f"and for {name!r} here")
                req.model = name
                req.version = str(rec.get("model_version", ""))
            if rec.get("parent_id") not in (None, 0):
                req.parent = _int(rec["parent_id"], where, "parent_id")
            stamps = rec.get("timestamps", [])
            if not isinstance(stamps, list):
                raise InputError(f"{where}: timestamps: expected a list of {{name, ns}}, got {type(stamps).__name__}")
            for s in stamps:
                if not isinstance(s, dict) or not isinstance(s.get("name"), str) or "ns" not in s:
                    raise InputError(f"{where}: timestamps: {s!r} is not a {{\"name\": ..., \"ns\": ...}} object")
                name = s["name"].strip().upper().replace(" ", "_")
                name = _ALIASES.get(name, name)
                ns = _int(s["ns"], where, f"timestamp {s['name']}")
                req.stamps.setdefault(name, ns)  # the first of a repeated name (decoupled models answer more than once)
    return _build(requests, model, warnings, [str(p) for p in paths])


def _build(requests: dict, model: str | None, warnings: list, sources: list) -> TritonTrace:
    src = sources[0] if len(sources) == 1 else f"{sources[0]} (+{len(sources) - 1})"
    if not requests:
        raise InputError(f"{src}: the trace holds no request (was tracing on, level TIMESTAMPS?)")
    models: dict = {}
    for req in requests.values():
        models[req.model] = models.get(req.model, 0) + 1
    names = ", ".join(f"{m}: {c} request{'s' if c != 1 else ''}"
                      for m, c in sorted(models.items(), key=lambda kv: str(kv[0])))
    if model is None:
        known = [m for m in models if m is not None]
        if len(known) > 1:
            raise InputError(f"{src}: traces of {len(known)} models ({names}); choose one with --model")
        model = known[0] if known else None
    elif model not in models:
        raise InputError(f"{src}: no trace of model {model!r} (the file has {names})")
    chosen = [(tid, r) for tid, r in requests.items() if r.model == model]
    timed = []
    for tid, r in chosen:
        if "REQUEST_START" not in r.stamps:
            if not r.stamps:
                continue  # a header whose timestamps the file lost (cut off); said below
            raise InputError(f"{r.first}: trace id {tid} has no REQUEST_START timestamp "
                             f"(it has {', '.join(sorted(r.stamps))}); was the level TIMESTAMPS?")
        timed.append((r.stamps["REQUEST_START"], tid, r))
    if len(timed) < len(chosen):
        warnings.append(f"{len(chosen) - len(timed)} trace id(s) of {model} have no timestamps (the file was cut?); left out")
    if not timed:
        raise InputError(f"{src}: no request of model {model!r} has timestamps")
    timed.sort(key=lambda t: (t[0], t[1]))
    start = np.array([t[0] for t in timed], dtype=np.int64)
    ids = np.array([t[1] for t in timed], dtype=np.int64)
    arrival_s = (start - start[0]) / 1e9
    extra = {}
    for col, (a, b) in STAGES.items():
        v = np.full(len(timed), np.nan)
        for i, (_, _, r) in enumerate(timed):
            if a in r.stamps and b in r.stamps:
                v[i] = (r.stamps[b] - r.stamps[a]) / 1e3
        extra[col] = v
    for col in STAGES:
        neg = extra[col] < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            a, b = STAGES[col]
            raise InputError(f"{timed[i][2].first}: trace id {ids[i]}: {b} is before {a}")
    keys = [(r.stamps.get("COMPUTE_START"), r.stamps.get("COMPUTE_END")) for _, _, r in timed]
    order = sorted({k for k in keys if None not in k})
    number = {k: j for j, k in enumerate(order)}
    execution = np.array([number.get(k, -1) for k in keys], dtype=np.int64)
    sizes = np.bincount(execution[execution >= 0], minlength=len(order)) if order else np.zeros(0, np.int64)
    extra["execution"] = execution
    extra["execution_requests"] = np.where(execution >= 0, sizes[np.maximum(execution, 0)] if len(sizes) else 0, 0)
    meta = {"format": "triton-trace", "sources": sources, "model": model,
            "model_version": sorted({r.version for _, _, r in timed if r.version}),
            "first_request_start_ns": int(start[0]),
            "note": "one sample per request (TIMESTAMPS traces carry no shapes); a trace sampled at rate "
                    "N > 1 holds one request in N"}
    parents = sorted({r.parent for _, _, r in timed if r.parent is not None})
    if parents:
        meta["ensemble_parents"] = len(parents)
    trace = Trace.from_arrivals(arrival_s, request_id=ids, source=src, meta=meta)
    return TritonTrace(trace, extra, warnings)


def save_triton_trace(tt: TritonTrace, out: str | Path) -> Path:
    """Write the arrival trace with its extra columns as CSV (or Parquet for .parquet/.pq)."""
    import pyarrow as pa

    from schedsim.files import replaced_atomically

    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise InputError(f"{out}: unknown trace extension {out.suffix!r}; use .csv, .parquet or .pq")
    if not out.parent.is_dir():
        raise InputError(f"{out}: directory {str(out.parent)!r} does not exist")
    t = tt.trace
    cols = {"arrival_s": pa.array(t.arrival_s), "request_id": pa.array(t.request_id)}
    for name in EXTRA_COLUMNS:
        v = tt.extra[name]
        cols[name] = pa.array(v, mask=np.isnan(v)) if v.dtype.kind == "f" else pa.array(v)
    table = pa.table(cols)
    with replaced_atomically(out) as tmp:
        if suffix == ".csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, tmp, write_options=pcsv.WriteOptions(quoting_style="needed",
                                                                        quoting_header="none"))
        else:
            import pyarrow.parquet as pq

            meta = json.dumps(t.meta, default=str).encode()
            pq.write_table(table.replace_schema_metadata({b"schedsim.meta": meta}), tmp)
    return out
