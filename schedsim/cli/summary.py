"""Printing a run's summary: request-level, or LLM (continuous, paged-kv or LLM static)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from schedsim.cli.options import fmt_metric


def print_summary(outcome) -> None:
    """A request-level run's summary (``schedsim run`` and ``schedsim live``)."""
    console = Console()
    s = outcome.summary
    console.print(f"[bold]{outcome.title}[/bold]")

    def fmt(key, unit="", digits=3):
        return fmt_metric(s, key, digits, unit)

    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("completed", fmt("completed", digits=0)), ("rejected", fmt("rejected", digits=0)),
        ("throughput (req/s)", fmt("throughput_rps", digits=1)),
        ("latency p50 (ms)", fmt("p50_ms")), ("latency p90 (ms)", fmt("p90_ms")),
        ("latency p95 (ms)", fmt("p95_ms")), ("latency p99 (ms)", fmt("p99_ms")),
        ("latency p99.9 (ms)", fmt("p999_ms")), ("latency mean (ms)", fmt("mean_ms")),
        ("mean queue delay (ms)", fmt("mean_queue_ms")),
        ("mean batch size (samples)", fmt("mean_batch_size", digits=2)),
    ]
    if s.get("unfinished"):
        rows.insert(2, ("unfinished", fmt("unfinished", digits=0)))
    for name, value in rows:
        table.add_row(name, value)
    util = s.get("utilization") or []
    table.add_row("instance utilisation", ", ".join(f"{u:.1%}" for u in util) or "-")
    if s.get("replications", 1) > 1:
        table.add_row("replications", f"{s['replications']} (95% CI in brackets)")
    console.print(table)
    hist = s.get("batch_size_histogram") or {}
    if hist:
        total = sum(hist.values())
        top = sorted(hist.items(), key=lambda kv: -kv[1])[:8]
        console.print("batch sizes (share of batches): " + ", ".join(
            f"{size}: {count / total:.1%}" for size, count in sorted(top)))
    for note in s.get("notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for path in outcome.written:
        console.print(f"wrote {path}")


def print_llm_summary(outcome) -> None:
    """An LLM run's summary: TTFT, TPOT, ITL and E2E, token throughput and KV use."""
    console = Console()
    s = outcome.summary
    console.print(f"[bold]{outcome.title}[/bold]")

    def fmt(key, digits=1):
        return fmt_metric(s, key, digits)

    table = Table(show_header=True, header_style="bold", box=None)
    for name in ("latency (ms)", "p50", "p90", "p99", "mean"):
        table.add_column(name, justify="right" if name != "latency (ms)" else "left")
    for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2e")):
        table.add_row(label, *(fmt(f"{key}_{q}_ms", 2) for q in ("p50", "p90", "p99", "mean")))
    console.print(table)

    rows = Table(show_header=False, box=None)
    rows.add_column("metric")
    rows.add_column("value", justify="right")
    pairs = [
        ("completed", fmt("completed", 0)), ("rejected (too long)", fmt("rejected_too_long", 0)),
        ("unfinished", fmt("unfinished", 0)),
        ("throughput (req/s)", fmt("throughput_rps", 2)),
        ("output tokens/s", fmt("output_tokens_per_s", 0)),
        ("preemptions", fmt("preemptions", 0)),
        ("running requests max / mean", f"{fmt('max_running', 0)} / {fmt('mean_running', 1)}"),
        ("KV blocks peak / total", f"{fmt('max_kv_blocks', 0)} / {fmt('kv_blocks_total', 0)}"),
        ("prefix-cache hit rate", fmt("prefix_hit_rate", 3)),
        ("mean queue delay (ms)", fmt("mean_queue_ms", 2)),
    ]
    if any(s.get("config", {}).get(k) is not None for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")):
        pairs += [("goodput (req/s)", fmt("goodput_rps", 2)), ("SLO attainment", fmt("slo_attainment", 3))]
    for name, value in pairs:
        rows.add_row(name, value)
    console.print(rows)
    for note in s.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {note}")
    for note in s.get("notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for path in outcome.written:
        console.print(f"wrote {path}")
