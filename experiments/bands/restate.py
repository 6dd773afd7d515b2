"""The fidelity tables restated with prediction bands, from the recorded live runs.

For every cell with at least 3 live runs of the same seeded trace, the point prediction of
today's ``schedsim run`` (bundled profile and sidecar: the default model) against the live
median, and its 90% band (19 replications, ``schedsim run``'s default) against the
individual live runs: how many of them it covers, and its half-width against the live
runs' own spread (1.645 sample standard deviations, the half-width a 90% band would need),
both in percent of the live median.

Request level (``--table request``): the live p99s are the per-run columns of
``experiments/fidelity/repeatability/pooled_p99_runs4-15.csv`` (each from one H200 live
run's analysis table); each cell's trace is regenerated from its seed as ``run_h200.py``
made it (``cells.py``; the rate and the measured request count from the newest analysis
table, ``results-run15/fidelity.csv`` in commit c4622d1f0791, which this reads with
``git show``), and simulated as ``schedsim run`` does.

LLM (``--table llm``): the live figures are the per-run columns of
``experiments/fidelity-llm/repeatability/pooled-runs7-14.csv``; each cell is simulated on
its recorded trace slice (``experiments/fidelity-llm/traces/``) with ``schedsim run``'s
LLM path and the bundled step profile (paged-kv with ``--vllm-compat 0.8``, the engine the
live runs used); its band draws step times from the profile's measured spread
(``schedsim.run.llm_bands``). ``schedsim run`` starts each cell from the live warm-up's token counts; the
experiment's own analysis carried the warm token counts from cell to cell as the one live
engine did, so a few TTFT figures differ slightly from its table.

    python experiments/bands/restate.py --table request --out experiments/bands/request_level.csv
    python experiments/bands/restate.py --table llm --out experiments/bands/llm.csv
    python experiments/bands/restate.py --table request --host-cv 0.03 0.05 --out experiments/bands/request_level_host3.csv
    python experiments/bands/restate.py --table llm --host-cv 0.03 0.05 --out experiments/bands/llm_host3.csv
"""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "fidelity"))

from schedsim.run.runner import execute  # noqa: E402
from schedsim.run.spec import LLMOptions, RunSpec  # noqa: E402
from schedsim.traces.io import save_trace  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402
from csv_out import write_csv  # noqa: E402  (experiments/bands, the script's own folder)

RAW_COMMIT = "c4622d1f0791"
LIVE_SPREAD_Z = 1.6449
SEQ_LEN = 128
WARMUP_S = 1.0


def git_show(path: str) -> str:
    return subprocess.run(["git", "show", f"{RAW_COMMIT}:{path}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def band_row(cell: str, metric: str, predicted: float, lo: float, hi: float, live: list[float]) -> dict:
    live = [float(v) for v in live if v == v]
    m = float(np.median(live))
    inside = [lo <= v <= hi for v in live]
    spread = LIVE_SPREAD_Z * float(np.std(live, ddof=1)) / m * 100
    half = (hi - lo) / 2 / m * 100
    return {"cell": cell, "metric": metric, "runs": len(live), "predicted": predicted, "band_lo": lo, "band_hi": hi,
            "live_median": m, "err_pct": (predicted - m) / m * 100, "runs_in_band": sum(inside),
            "coverage": float(np.mean(inside)), "median_in_band": lo <= m <= hi,
            "band_half_width_pct": half, "live_spread_pct": spread,
            "half_width_over_spread": half / spread if spread > 0 else math.inf,
            "live_runs": json.dumps([round(v, 6) for v in live])}


def profile_with_record(tmp: Path, record: dict) -> Path:
    """A copy of the bundled profile (with the contention profiles its sidecar names) whose
    sidecar carries ``record`` as its host_variation."""
    import shutil

    from schedsim.cost.profile import default_profile_path

    src = default_profile_path()
    for f in src.parent.glob("bert-base-fp16-cg-*"):
        shutil.copy(f, tmp / f.name)
    side = tmp / (src.stem + ".json")
    meta = json.loads(side.read_text())
    meta["host_variation"] = record
    side.write_text(json.dumps(meta))
    return tmp / src.name


def profile_with_host_cv(tmp: Path, between: float, within: float, window_s: float = 0.25) -> Path:
    """A copy of the bundled profile whose sidecar carries a host_variation record with these
    figures: a sensitivity check of the band, not a measurement."""
    return profile_with_record(tmp, {"between_runs_cv": between, "within_run_cv": within, "window_s": window_s,
                                     "method": "assumed (restate.py --host-cv): a sensitivity check, not measured"})


def profile_with_host_records(tmp: Path, paths: list[Path]) -> Path:
    """A copy of the bundled profile with these measured records (sidecars of ``schedsim
    profile --batch-sizes 1 --seq-lens 128 --host-variation-s 2`` on the serving machines, or
    bare records) pooled, the timeline over the bundled table's own batch-1 mean: how much
    slower than the bundled table each measured round ran."""
    from schedsim.cost.profile import default_profile_path, load_profile
    from schedsim.profiling.host_variation import combine, relative_to

    records = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        records.append(data.get("host_variation", data))
    table = load_profile(default_profile_path()).table
    first = table[(table.batch == 1) & (table.seq_len == SEQ_LEN)].iloc[0]
    pooled = relative_to(combine(records), float(first.latency_ms_mean), f"the bundled table's mean at batch 1, seq_len {SEQ_LEN}")
    return profile_with_record(tmp, pooled)


def request_level(replications: int, only: str, host_cv: tuple | None = None, host_records=()) -> pd.DataFrame:
    import run_h200  # noqa: E402  (experiments/fidelity: make_arrivals, the cells' seeded traces)
    from cells import CELLS  # noqa: E402

    pooled = pd.read_csv(ROOT / "experiments/fidelity/repeatability/pooled_p99_runs4-15.csv")
    runs_cols = [c for c in pooled.columns if c.startswith("p99_results")]
    table = pd.read_csv(io.StringIO(git_show("experiments/fidelity/results-run15/fidelity.csv")))
    table = table[table.profile == "e"].set_index("cell")
    by_name = {c["name"]: c for c in CELLS}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = (profile_with_host_cv(Path(tmp), *host_cv) if host_cv else
                   profile_with_host_records(Path(tmp), host_records) if host_records else None)
        for _, p in pooled.iterrows():
            live = [p[c] for c in runs_cols if p[c] == p[c]]
            if len(live) < 3 or p.cell not in table.index or (only and only not in p.cell):
                continue
            cell, t = by_name[p.cell], table.loc[p.cell]
            rate, measured = float(t.rate_rps), int(t.requests)
            # The duration run_h200.py chose (7 s, shortened for fast cells): the one whose
            # arrivals after the warm-up match the measured count best.
            best = None
            for duration in sorted({7.0, min(7.0, max(3.0, WARMUP_S + 40_000 / rate)), 12.0, 17.0}):
                arr = run_h200.make_arrivals(cell, rate, duration)
                miss = abs(int((arr >= WARMUP_S).sum()) - measured)
                if best is None or miss < best[0]:
                    best = (miss, arr, duration)
            miss, arrivals, duration = best
            trace = Trace.from_arrivals(arrivals, seq_len=np.full(arrivals.size, SEQ_LEN))
            path = save_trace(trace, Path(tmp) / f"{len(rows)}.parquet")
            spec = RunSpec(trace=path, policy=cell["policy"], params=dict(cell["params"]),
                           instances=cell["instances"], warmup_s=WARMUP_S, band=0.9, profile=profile,
                           band_replications=replications)
            s = execute(spec).summary
            row = band_row(p.cell, "p99", s["p99_ms"], s["p99_ms_lo"], s["p99_ms_hi"], live)
            row |= {"instances": cell["instances"], "requests": int(s["requests"]), "requests_live": measured,
                    "duration_s": duration}
            rows.append(row)
            print(f"{p.cell:30s} p99 {s['p99_ms']:.3f} band {s['p99_ms_lo']:.3f}-{s['p99_ms_hi']:.3f} live "
                  f"{row['live_median']:.3f} ({row['runs']} runs) err {row['err_pct']:+.1f}% in {row['runs_in_band']}"
                  f"/{row['runs']} half {row['band_half_width_pct']:.1f}% spread {row['live_spread_pct']:.1f}%",
                  flush=True)
    return pd.DataFrame(rows)


def step_profile_with_record(tmp: Path, record: dict) -> Path:
    """A copy of the bundled step profile whose sidecar carries ``record`` as its host_variation."""
    import shutil

    from schedsim.run.llm_runner import default_step_profile_path

    src = default_step_profile_path()
    shutil.copy(src, tmp / src.name)
    meta = json.loads(src.with_suffix(".json").read_text())
    meta["host_variation"] = record
    (tmp / src.name).with_suffix(".json").write_text(json.dumps(meta))
    return tmp / src.name


def llm_host_profile(tmp: Path, host_cv: tuple | None, host_records) -> Path | None:
    """The step profile for the LLM table: the bundled one, or a copy with an assumed record
    (``--host-cv``: a sensitivity check, not a measurement) or measured records pooled
    (``--host-records``: sidecars of ``schedsim profile llm --host-variation-s`` on the serving
    machines, the first one's rounds the reference)."""
    from schedsim.profiling.host_variation import combine

    if host_cv:
        return step_profile_with_record(tmp, {"between_runs_cv": host_cv[0], "within_run_cv": host_cv[1],
                                              "window_s": 0.25, "method": "assumed (restate.py --host-cv): a "
                                              "sensitivity check, not measured"})
    if host_records:
        records = [json.loads(Path(p).read_text()) for p in host_records]
        return step_profile_with_record(tmp, combine([r.get("host_variation", r) for r in records]))
    return None


def llm(only: str, replications: int = 19, host_cv: tuple | None = None, host_records=()) -> pd.DataFrame:
    import importlib.util

    spec_ = importlib.util.spec_from_file_location("fidelity_llm_common", ROOT / "experiments/fidelity-llm/common.py")
    common = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(common)
    LLM_CELLS = common.load_cells().CELLS

    pooled = pd.read_csv(ROOT / "experiments/fidelity-llm/repeatability/pooled-runs7-14.csv")
    runs_cols = [c for c in pooled.columns if c.startswith("live_results")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = llm_host_profile(Path(tmp), host_cv, host_records)
        for cell in LLM_CELLS:
            if only and only not in cell["name"]:
                continue
            trace = common.load_cell_trace(ROOT / "experiments/fidelity-llm/traces" / f"{cell['name']}.npz")
            path = save_trace(trace, Path(tmp) / f"{cell['name']}.parquet")
            spec = RunSpec(trace=path, policy=cell["policy"], band=0.9, band_replications=replications,
                           profile=profile)
            # The live engine of these runs is schedsim's own paged-KV engine as it was then:
            # the 0.8 preset is that model (the current defaults follow later vLLM releases).
            extra = {"vllm_compat": "0.8"} if cell["policy"] == "paged-kv" else {}
            options = LLMOptions(params=dict(cell["params"]) | extra)
            s = execute(spec, options).summary
            for _, p in pooled[pooled.cell == cell["name"]].iterrows():
                key = f"{p.metric}_ms"
                live = [p[c] for c in runs_cols if p[c] == p[c]]
                if len(live) < 3:
                    continue
                rows.append(band_row(cell["name"], p.metric, s[key], s[f"{key}_lo"], s[f"{key}_hi"], live)
                            | {"band_sources": "; ".join(s["band"]["sources"])})
            print(cell["name"], "done", flush=True)
    return pd.DataFrame(rows)


def summary_lines(df: pd.DataFrame) -> list[str]:
    out = [f"cells x metrics: {len(df)}",
           f"point error against the live median: median |err| {df.err_pct.abs().median():.1f}%, "
           f"worst {df.err_pct.abs().max():.1f}%",
           f"coverage of individual live runs: {df.runs_in_band.sum()} of {df.runs.sum()} "
           f"({df.runs_in_band.sum() / df.runs.sum():.0%}); live medians inside: {df.median_in_band.mean():.0%}",
           f"band half-width: median {df.band_half_width_pct.median():.2f}% of the live median; live spread "
           f"median {df.live_spread_pct.median():.2f}%; ratio median {df.half_width_over_spread.median():.2f}"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", choices=("request", "llm"), required=True)
    ap.add_argument("--replications", type=int, default=19)
    ap.add_argument("--only", default="", help="cells whose name contains this")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--host-cv", type=float, nargs=2, metavar=("BETWEEN", "WITHIN"),
                    help="give the bundled (step) profile an assumed host_variation record "
                         "(between-runs and within-run CV, 0.25 s windows): a sensitivity check")
    ap.add_argument("--host-records", type=Path, nargs="+", default=(),
                    help="measured host-variation records, pooled: request table, sidecars of schedsim profile "
                         "--batch-sizes 1 --seq-lens 128 --host-variation-s 2 on the serving machines (over the "
                         "bundled table's batch-1 mean); LLM table, sidecars of schedsim profile llm "
                         "--host-variation-s 2 (over the first record's rounds)")
    args = ap.parse_args(argv)
    df = (request_level(args.replications, args.only, args.host_cv, args.host_records) if args.table == "request"
          else llm(args.only, args.replications, args.host_cv, args.host_records))
    for line in summary_lines(df):
        print(line)
    write_csv(df, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
