"""Triton's model statistics, read from a file or a live server, and turned into a cost table.

Triton answers ``GET /v2/models[/NAME[/versions/V]]/stats`` with ``{"model_stats": [...]}``,
one entry per model version (the statistics extension of its HTTP/REST protocol; the
fields are the ``ModelStatisticsResponse`` message of its gRPC protocol, which is how this
module parses them, so numbers given as JSON strings, as protobuf's own JSON writer gives
64-bit integers, are read too). Every figure is a running total since the server started:

- ``batch_stats``: per batch size (samples in one execution), the count of executions and
  the total nanoseconds of ``compute_input``, ``compute_infer`` and ``compute_output``;
- ``inference_stats``: per request, the count and total of ``queue``, ``compute_*`` and
  ``success`` (a request in a batch is charged its whole batch's compute times).

Totals and counts give means, never spreads: a table built from them says so
(``spread`` in the sidecar), its percentiles are the mean and its ``latency_ms_std`` is 0,
so the cost model's ``auto`` spread becomes ``none`` and every batch of a size takes that
size's mean. Two snapshots taken around a stretch of load give that stretch's own
figures (:meth:`ModelStats.since`), which is how the Triton profiler
(:mod:`schedsim.triton.profiling`) measures.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from schedsim.errors import InputError

STAGES = ("compute_input", "compute_infer", "compute_output")
"""The parts of an execution that Triton times per batch size; a batch's cost is their sum."""
REQUEST_STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
"""Per-request totals in ``inference_stats``."""
FEW_EXECUTIONS = 30
"""A batch size executed fewer times than this is flagged: its mean is uncertain."""

SPREAD_NOTE = ("unknown: Triton's batch_stats hold a total time and a count per batch size, not a "
               "distribution; latency_ms_p50/p90/p99 are the mean and latency_ms_std is 0, so the cost "
               "model's spread 'auto' resolves to 'none' and every batch of a size takes that size's "
               "mean (p99 predictions then miss the service-time spread; measure with "
               "`schedsim profile --backend triton` for percentiles)")


@dataclass(frozen=True)
class ModelStats:
    """One model version's statistics: running totals (or, after :meth:`since`, a difference)."""

    name: str
    """The model's name."""
    version: str
    """Its version ("" when the server does not report one)."""
    last_inference_ms: int
    """When the last request was answered, milliseconds since the epoch (0: never)."""
    inference_count: int
    """Samples inferred (a request of batch 2 counts 2)."""
    execution_count: int
    """Model executions (batches)."""
    requests: dict
    """``inference_stats``: stage -> (count, total ns), one count per request."""
    batches: dict
    """``batch_stats``: batch size -> {stage -> (count, total ns)} for the stages in :data:`STAGES`."""

    @property
    def label(self) -> str:
        return f"{self.name} (version {self.version})" if self.version else self.name

    def since(self, before: "ModelStats", src: str = "statistics") -> "ModelStats":
        """What happened between snapshot ``before`` and this one (every total and count differenced)."""
        if (before.name, before.version) != (self.name, self.version):
            raise ValueError(f"snapshots of different models: {before.label} and {self.label}")

        def sub(now, then, what):
            count, ns = now[0] - then[0], now[1] - then[1]
            if count < 0 or ns < 0:
                raise InputError(f"{src}: {self.label}: {what} went down between two snapshots "
                                 "(was the server restarted?)")
            return count, ns

        zero = (0, 0)
        requests = {k: sub(v, before.requests.get(k, zero), k) for k, v in self.requests.items()}
        batches = {}
        for b, stages in self.batches.items():
            old = before.batches.get(b, {})
            d = {k: sub(v, old.get(k, zero), f"batch {b} {k}") for k, v in stages.items()}
            if any(c for c, _ in d.values()):
                batches[b] = d
        return ModelStats(self.name, self.version, self.last_inference_ms,
                          self.inference_count - before.inference_count,
                          self.execution_count - before.execution_count, requests, batches)

    def executions(self, batch: int) -> int:
        """Executions of batch size ``batch`` (its ``compute_infer`` count)."""
        return self.batches.get(batch, {}).get("compute_infer", (0, 0))[0]

    def batch_mean_ns(self, batch: int) -> dict:
        """stage -> mean ns per execution of batch size ``batch`` (stages never counted are 0)."""
        return {k: (ns / c if c else 0.0) for k, (c, ns) in
                ((k, self.batches[batch].get(k, (0, 0))) for k in STAGES)}

    def request_mean_us(self) -> dict:
        """stage -> mean microseconds per request from ``inference_stats`` (stages never counted left out)."""
        return {k: ns / c / 1e3 for k, (c, ns) in self.requests.items() if c}


# ----------------------------------------------------------------------------- parsing

def parse_stats(doc, src: str) -> list[ModelStats]:
    """Every model version in a decoded statistics response (``{"model_stats": [...]}``)."""
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2

    if not isinstance(doc, dict):
        raise InputError(f"{src}: not Triton statistics: expected a JSON object with 'model_stats', "
                         f"got {type(doc).__name__}")
    if "error" in doc and "model_stats" not in doc:
        raise InputError(f"{src}: the server answered an error: {doc['error']}")
    if "model_stats" not in doc:
        keys = ", ".join(sorted(map(str, doc))[:5]) or "none"
        raise InputError(f"{src}: not Triton statistics: no 'model_stats' field (fields: {keys})")
    try:
        msg = json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise InputError(f"{src}: not Triton statistics: {_parse_error(str(e))}") from None
    out = []
    for i, m in enumerate(msg.model_stats):
        if not m.name:
            raise InputError(f"{src}: model_stats[{i}].name: missing (every entry names its model)")
        batches = {}
        for j, b in enumerate(m.batch_stats):
            if b.batch_size < 1:
                raise InputError(f"{src}: model_stats[{i}].batch_stats[{j}].batch_size: {b.batch_size} must be >= 1")
            if b.batch_size in batches:
                raise InputError(f"{src}: model_stats[{i}].batch_stats[{j}].batch_size: {b.batch_size} "
                                 "appears twice for this model")
            batches[int(b.batch_size)] = {k: (int(getattr(b, k).count), int(getattr(b, k).ns)) for k in STAGES}
        requests = {k: (int(getattr(m.inference_stats, k).count), int(getattr(m.inference_stats, k).ns))
                    for k in REQUEST_STAGES}
        out.append(ModelStats(m.name, m.version, int(m.last_inference), int(m.inference_count),
                              int(m.execution_count), requests, dict(sorted(batches.items()))))
    return out


def _parse_error(text: str) -> str:
    """protobuf's nested 'Failed to parse X field: ...' as 'x.y.z: reason'."""
    fields = re.findall(r"Failed to parse (\w+) field: ", text)
    reason = re.split(r"Failed to parse \w+ field: ", text)[-1]
    at = re.search(r" at ModelStatisticsResponse\.(\S+?)\.*$", reason)
    if at:
        return f"{at.group(1)}: {reason[:at.start()]}"
    return (".".join(fields) + ": " if fields else "") + reason.rstrip(".")


def select(models: list[ModelStats], src: str, model: str | None = None,
           version: str | None = None) -> ModelStats:
    """The one model version asked for (or the only one there is)."""
    found = [m for m in models if (model is None or m.name == model) and (version is None or m.version == version)]
    names = ", ".join(m.label for m in models) or "none"
    if not found:
        want = f"model {model!r}" + (f" version {version!r}" if version else "") if model else f"version {version!r}"
        raise InputError(f"{src}: no statistics for {want} (the file has: {names})")
    if len(found) > 1:
        raise InputError(f"{src}: statistics for {len(found)} model versions ({', '.join(m.label for m in found)}); "
                         "choose one with --model NAME" + (" and --version V" if model else ""))
    return found[0]


# ----------------------------------------------------------------------------- reading

def is_url(source: str) -> bool:
    """http(s)://... or a bare HOST:PORT[/path] (when no file of that name exists)."""
    s = str(source)
    if s.startswith(("http://", "https://")):
        return True
    return not Path(s).exists() and re.fullmatch(r"[\w.\-]+:\d+(/\S*)?", s) is not None


def server_base(source: str) -> str:
    """``http://host:port`` of a URL or HOST:PORT."""
    s = source if str(source).startswith(("http://", "https://")) else f"http://{source}"
    p = urllib.parse.urlsplit(s)
    return f"{p.scheme}://{p.netloc}"


def stats_url(source: str, model: str | None = None, version: str | None = None) -> str:
    """The statistics URL for a server address; a URL that already names a path is kept."""
    s = source if str(source).startswith(("http://", "https://")) else f"http://{source}"
    if urllib.parse.urlsplit(s).path.strip("/"):
        return s
    path = "/v2/models"
    if model:
        path += f"/{urllib.parse.quote(model, safe='')}"
        if version:
            path += f"/versions/{urllib.parse.quote(version, safe='')}"
    return server_base(s) + path + "/stats"


def fetch_json(url: str, timeout_s: float = 10.0):
    """GET ``url`` and decode its JSON; a one-line InputError for every failure."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail).get("error", detail)
        except (ValueError, AttributeError):
            pass
        raise InputError(f"{url}: the server answered {e.code}: {' '.join(str(detail).split())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise InputError(f"{url}: cannot reach the server: {reason}") from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{url}: the answer is not JSON: {e}") from None


def read_file(path: str | Path):
    """Decode a statistics JSON file; one-line errors naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such statistics file (expected the JSON of /v2/models[/NAME]/stats, or a URL)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read: {e}") from None
    if not text.strip():
        raise InputError(f"{p}: empty file (expected the JSON of /v2/models[/NAME]/stats)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{p}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None


def snapshot(url: str, model: str, version: str | None = None, timeout_s: float = 10.0) -> ModelStats:
    """One model's statistics from a live server now."""
    full = stats_url(url, model, version)
    return select(parse_stats(fetch_json(full, timeout_s), full), full, model, version)


def read_stats(source: str, model: str | None = None, version: str | None = None,
               timeout_s: float = 10.0) -> tuple[ModelStats, dict]:
    """Statistics of one model version from a file or a server, and where they came from.

    The provenance holds ``source`` and, from a server, its name and version and the
    model's configuration (max_batch_size, dynamic_batching, instance_group), each
    ``None`` when the server did not give it.
    """
    source = str(source)
    prov: dict = {"source": source}
    if is_url(source):
        url = stats_url(source, model, version)
        stats = select(parse_stats(fetch_json(url, timeout_s), url), url, model, version)
        base = server_base(source)
        prov.update(source=url, server=_best_effort(f"{base}/v2", timeout_s))
        cfg_url = f"{base}/v2/models/{urllib.parse.quote(stats.name, safe='')}" + \
            (f"/versions/{urllib.parse.quote(stats.version, safe='')}" if stats.version else "") + "/config"
        prov["model_config"] = _best_effort(cfg_url, timeout_s)
    else:
        stats = select(parse_stats(read_file(source), source), source, model, version)
    return stats, prov


def _best_effort(url: str, timeout_s: float):
    try:
        doc = fetch_json(url, timeout_s)
    except InputError:
        return None
    return doc if isinstance(doc, dict) else None


# ----------------------------------------------------------------------------- cost table

def cost_rows(stats: ModelStats, src: str) -> tuple[list[dict], list[str]]:
    """One profile row per executed batch size, and warnings about what the table lacks."""
    rows, warnings = [], []
    for b in sorted(stats.batches):
        n = stats.executions(b)
        if n == 0:
            continue
        counts = {k: stats.batches[b].get(k, (0, 0))[0] for k in STAGES}
        if len(set(counts.values())) > 1:
            warnings.append(f"batch {b}: stage counts differ ({', '.join(f'{k} {c}' for k, c in counts.items())}); "
                            "each stage's mean is over its own count")
        means = stats.batch_mean_ns(b)
        ms = sum(means.values()) / 1e6
        if not ms > 0:
            warnings.append(f"batch {b}: {n} executions with a total time of 0 ns; left out")
            continue
        rows.append({"batch": b, "latency_ms_mean": ms, "latency_ms_p50": ms, "latency_ms_p90": ms,
                     "latency_ms_p99": ms, "latency_ms_std": 0.0, "n": n,
                     **{f"{k}_ms_mean": means[k] / 1e6 for k in STAGES}})
        if n < FEW_EXECUTIONS:
            warnings.append(f"batch {b}: {n} execution{'s' if n != 1 else ''} only; its mean is uncertain")
    if not rows:
        raise InputError(f"{src}: {stats.label} has no executions in its batch_stats "
                         "(send it requests first, or choose another model with --model)")
    return rows, warnings


def _ranges(values: list[int]) -> str:
    """[4, 5, 6, 9] -> '4-6, 9'."""
    from schedsim.profiling.host import _ranges as cpu_ranges  # the same notation as CPU lists

    return cpu_ranges(values).replace(",", ", ")


def coverage(batches: list[int], max_batch_size: int | None) -> tuple[dict, list[str]]:
    """Which batch sizes the table lacks, and how the cost model will treat them."""
    lo, hi = batches[0], batches[-1]
    gaps = [b for b in range(lo, hi + 1) if b not in set(batches)]
    info: dict = {"measured_batches": batches, "interpolated_batches": gaps}
    warnings = []
    if gaps:
        warnings.append(f"batch sizes {_ranges(gaps)} were not executed: the cost model interpolates them "
                        "linearly between the nearest measured sizes")
    if lo > 1:
        info["below_table"] = list(range(1, lo))
        warnings.append(f"no batch below {lo} was executed: the simulator refuses smaller batches unless "
                        "--extrapolate (then linear from the two smallest sizes, never below the smallest)")
    if max_batch_size and max_batch_size > hi:
        info["above_table"] = [hi + 1, max_batch_size]
        warnings.append(f"the model allows batches up to {max_batch_size} but none above {hi} was executed: "
                        "the simulator refuses larger batches unless --extrapolate (then linear from the two "
                        "largest sizes)")
    return info, warnings


def _config_summary(cfg) -> dict | None:
    if not isinstance(cfg, dict):
        return None
    groups = cfg.get("instance_group") or []
    return {"max_batch_size": cfg.get("max_batch_size"), "backend": cfg.get("backend") or cfg.get("platform"),
            "dynamic_batching": cfg.get("dynamic_batching"),
            "instances": sum(int(g.get("count", 1)) for g in groups if isinstance(g, dict)) or None,
            "instance_kind": sorted({g.get("kind") for g in groups if isinstance(g, dict) and g.get("kind")})}


def _iso_ms(ms: int) -> str | None:
    return datetime.fromtimestamp(ms / 1e3, timezone.utc).isoformat(timespec="seconds") if ms > 0 else None


def import_profile(source: str, out: str | Path, model: str | None = None, version: str | None = None,
                   timeout_s: float = 10.0):
    """``schedsim profile import``: a Triton statistics file or server into a cost table.

    Returns (the saved :class:`~schedsim.cost.profile.Profile`, warnings).
    """
    import pandas as pd

    from schedsim.cost.profile import SCHEMA, save_profile

    stats, prov = read_stats(source, model, version, timeout_s)
    src = prov["source"]
    rows, warnings = cost_rows(stats, src)
    cfg = _config_summary(prov.get("model_config"))
    max_bs = cfg["max_batch_size"] if cfg and isinstance(cfg.get("max_batch_size"), int) else None
    cover, more = coverage([r["batch"] for r in rows], max_bs)
    warnings += more
    server = prov.get("server")
    meta = {
        "schema": SCHEMA,
        "backend": "triton",
        **({"backend_version": server.get("version")} if server and server.get("version") else {}),
        "server": {"name": server.get("name"), "version": server.get("version")} if server else None,
        "precision": "unknown",
        "model": stats.name,
        "model_version": stats.version,
        "device": ", ".join(cfg["instance_kind"]) if cfg and cfg["instance_kind"] else "unknown",
        "source": src,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "last_inference": _iso_ms(stats.last_inference_ms),
        "timing": ("Triton's batch_stats: per batch size, the total compute_input + compute_infer + "
                   "compute_output over its executions, divided by its execution count (n); the "
                   "server's own clocks, so queueing and the client-server path are not in it"),
        "spread": SPREAD_NOTE,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "per_request_us": {k: round(v, 3) for k, v in stats.request_mean_us().items()},
        "model_config": cfg,
        "coverage": cover,
        "warnings": warnings,
    }
    prof = save_profile(pd.DataFrame(rows), meta, out)
    return prof, warnings
