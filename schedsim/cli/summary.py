"""Printing a run's summary: request-level, or LLM (continuous, paged-kv or LLM static)."""

from __future__ import annotations

from schedsim.cli.options import fmt_metric
from schedsim.cli.text_table import BOLD, BOLD_YELLOW, YELLOW, print_table, style
from schedsim.run.bands import band_text


def print_summary(outcome) -> None:
    """A request-level run's summary (``schedsim run`` and ``schedsim live``)."""
    s = outcome.summary
    print(style(outcome.title, BOLD))

    def fmt(key, unit="", digits=3):
        return fmt_metric(s, key, digits, unit)

    rows = [
        ("completed", fmt("completed", digits=0)), ("rejected", fmt("rejected", digits=0)),
        ("throughput (req/s)", fmt("throughput_rps", digits=1)),
        ("offered rate (req/s)", fmt("offered_rps", digits=1)),
        ("latency p50 (ms)", fmt("p50_ms")), ("latency p90 (ms)", fmt("p90_ms")),
        ("latency p95 (ms)", fmt("p95_ms")), ("latency p99 (ms)", fmt("p99_ms")),
        ("latency p99.9 (ms)", fmt("p999_ms")), ("latency mean (ms)", fmt("mean_ms")),
        ("mean queue delay (ms)", fmt("mean_queue_ms")),
        ("mean batch size (samples)", fmt("mean_batch_size", digits=2)),
    ]
    if s.get("unfinished"):
        rows.insert(2, ("unfinished", fmt("unfinished", digits=0)))
    util = s.get("utilization") or []
    rows.append(("instance utilisation", ", ".join(f"{u:.1%}" for u in util) or "-"))
    if s.get("replications", 1) > 1:
        rows.append(("replications", f"{s['replications']} (95% CI in brackets)"))
    print_table(rows, header=("metric", "value"))
    if band_text(s):
        print(band_text(s))
    print_capacity(s)
    hist = s.get("batch_size_histogram") or {}
    if hist:
        print(batch_size_line(hist))
    effective = s.get("config", {}).get("effective")
    if effective:
        print(settings_line(effective))
    for warning in s.get("warnings", []):
        print(f"{style('warning:', BOLD_YELLOW)} {warning}")
    for note in s.get("notes", []):
        print(f"note: {note}")
    for path in outcome.written:
        print(f"wrote {path}")


def print_capacity(s: dict) -> None:
    """The capacity table and how it was found (schedsim.planning.capacity)."""
    rows = capacity_rows(s)
    if not rows:
        return
    print_table(rows, header=("capacity", "value"))
    print(capacity_line(s))


def capacity_rows(s: dict) -> list[tuple[str, str]]:
    """The capacity rows of a summary (schedsim.planning.capacity): what a planner acts on."""
    if "capacity_rps" not in s:
        return []
    rows = [("capacity (req/s)", fmt_metric(s, "capacity_rps", 1)),
            ("headroom (capacity / offered)", _times(s.get("headroom")))]
    if s.get("capacity_output_tokens_per_s") is not None:
        rows.append(("capacity (output tokens/s)", fmt_metric(s, "capacity_output_tokens_per_s", 0)))
    if s.get("gpu_work_share") is not None:
        rows.append(("GPU work share (offered / saturation)", _share(s.get("gpu_work_share"))))
    if s.get("gpu_busy_fraction") is not None:
        rows.append(("GPU busy (any batch running)", _share(s.get("gpu_busy_fraction"))))
    return rows


def capacity_line(s: dict) -> str:
    """How the capacity was found, and what the headroom means."""
    cap = s.get("capacity")
    if not cap:
        return ""
    head = s.get("headroom")
    verdict = ""
    if isinstance(head, float) and head == head:
        verdict = (f": the offered load can grow {head:,.2f}x" if head >= 1 else
                   f": the offered load is {1 / head:,.2f}x what it can take" if head > 0 else
                   ": no rate tried meets the SLO")
    # Busy time grows with batching at any load that fills a batch now and then.
    busy = "; instance utilisation is busy time, not headroom" if s.get("utilization") else ""
    return f"capacity: {cap.get('basis')}{verdict}{busy}"


def _times(v) -> str:
    return "-" if v is None or v != v else f"{v:,.2f}x"


def _share(v) -> str:
    return "-" if v is None or v != v else f"{v:.1%}"


SHOWN_SIZES = 12
"""Batch sizes listed one by one; beyond this many the most common are listed and the rest summed."""


def batch_size_line(hist: dict) -> str:
    """Every batch size's share of batches, in size order; with more than :data:`SHOWN_SIZES`
    sizes, the most common ones and the share of all the others, so no batch goes unsaid."""
    counts = {int(k): int(v) for k, v in hist.items()}
    total = sum(counts.values())
    shown = sorted(counts, key=lambda k: (-counts[k], k))[:SHOWN_SIZES - 1] \
        if len(counts) > SHOWN_SIZES else list(counts)
    line = "batch sizes (share of batches): " + ", ".join(
        f"{size}: {counts[size] / total:.1%}" for size in sorted(shown))
    rest = [k for k in counts if k not in set(shown)]
    if rest:
        line += (f", {len(rest)} other sizes ({min(rest)}..{max(rest)}): "
                 f"{sum(counts[k] for k in rest) / total:.1%}")
    return line


def settings_line(effective: dict) -> str:
    """The settings the run used, defaults included, with the profile and its device."""
    skip = {"policy", "instances", "profile", "device", "model"}
    parts = [f"{k}={v}" for k, v in effective.items() if k not in skip]
    n = effective.get("instances", 1)
    where = f"profile {effective.get('profile')}" + (f" ({effective['device']})" if effective.get("device") else "")
    return (f"settings: {effective.get('policy')}" + (f" ({', '.join(parts)})" if parts else "")
            + f", {n} instance{'s' if n != 1 else ''}, {where}")


def print_llm_summary(outcome) -> None:
    """An LLM run's summary: TTFT, TPOT, ITL and E2E, token throughput and KV use."""
    s = outcome.summary
    print(style(outcome.title, BOLD))

    def fmt(key, digits=1):
        return fmt_metric(s, key, digits)

    print_table([(label, *(fmt(f"{key}_{q}_ms", 2) for q in ("p50", "p90", "p99", "mean")))
                 for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2e"))],
                header=("latency (ms)", "p50", "p90", "p99", "mean"))
    if band_text(s):
        print(band_text(s))

    pairs = [
        ("completed", fmt("completed", 0)), ("rejected (too long)", fmt("rejected_too_long", 0)),
        ("unfinished", fmt("unfinished", 0)),
        ("throughput (req/s)", fmt("throughput_rps", 2)),
        ("offered rate (req/s)", fmt("offered_rps", 2)),
        ("output tokens/s", fmt("output_tokens_per_s", 0)),
        ("preemptions", fmt("preemptions", 0)),
        ("running requests max / mean", f"{fmt('max_running', 0)} / {fmt('mean_running', 1)}"),
        ("KV blocks peak / total", f"{fmt('max_kv_blocks', 0)} / {fmt('kv_blocks_total', 0)}"),
        ("prefix-cache hit rate", fmt("prefix_hit_rate", 3)),
        ("mean queue delay (ms)", fmt("mean_queue_ms", 2)),
    ]
    if any(s.get("config", {}).get(k) is not None for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")):
        pairs += [("goodput (req/s)", fmt("goodput_rps", 2)), ("SLO attainment", fmt("slo_attainment", 3))]
    print_table(pairs)
    print_capacity(s)
    effective = s.get("config", {}).get("effective")
    if effective:
        print(settings_line(effective))
    for note in s.get("warnings", []):
        print(f"{style('warning:', YELLOW)} {note}")
    for note in s.get("notes", []):
        print(f"note: {note}")
    for path in outcome.written:
        print(f"wrote {path}")
