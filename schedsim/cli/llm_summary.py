"""Printing an LLM run's summary (``schedsim run`` with continuous, paged-kv or LLM static)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from schedsim.cli.options import fmt_metric


def print_llm_summary(outcome) -> None:
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
    for path in outcome.written:
        console.print(f"wrote {path}")
