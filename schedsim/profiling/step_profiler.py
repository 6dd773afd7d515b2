"""Measure LLM step compositions on the paged engine into a step profile (CSV + JSON sidecar).

A *composition* is the shape of one engine step as the cost model sees it: ``prefill_seqs``
identical prefill chunks of ``prefill_chunk`` tokens, each over ``prefill_context`` cached
tokens, plus ``decode_seqs`` decodes, each over ``decode_context`` cached tokens, or over
contexts spread up to ``decode_context`` (*mixed contexts*, as a live batch has: the CSV's
``decode_kv_tokens`` then counts the tokens the decode rows really hold).
:func:`run_step_profile` builds a :class:`~schedsim.live.engines.llm_engine.PagedLLMEngine`
with one KV pool large enough for the largest composition, gives every row its own
blocks, and times whole steps:

1. *prepare*: each composition runs once, largest first (decode graphs are captured
   here, so the shared graph memory pool grows to the largest graph once);
2. *warm-up*: a few calls each, in a seeded random order; the fastest warm-up call
   sets how many back-to-back samples a visit takes (cheap steps take more);
3. *sampling*: rounds that visit every composition in a fresh random order (as
   :func:`schedsim.profiling.measure.interleaved` does for batch sizes), so drift spreads over all
   of them, until each has ``min_samples`` samples or ``max_time_s`` has passed.

*Fresh shapes* (the default; ``fresh_shapes=False``, ``--warm-shapes``, times the nominal
shape every time). A server meets a prompt length it has not run before at nearly every
prefill, and an eager step of a new length costs more the first time: its GEMMs have a
new M (the step's token count), and cuBLAS(Lt) picks a kernel per new (M, N, K) with a
heuristic query on the host, cached afterwards (the first call of a fresh length cost
0.6-5.6 ms more on the H200 with no cudaMalloc and no cuDNN,
experiments/fidelity-llm/diagnose_first_call.json). So each sample of a composition with
a prefill chunk moves its chunk(s) by a few tokens, to the nearest step token count the
engine has not run yet, alternately above and below the nominal chunk so that the mean
stays at it (the CSV keeps the nominal chunk). The band is ``jitter_tokens(chunk)``:
+-8 tokens at small chunks, where a step's cost hardly depends on its length, up to +-64
at 256 tokens and more (3% of a 2048 chunk). When compositions sharing a token count have
used up their band (small chunks over many contexts), a sample runs the nominal, warm
shape; the sidecar counts those (``sampling.fresh_shapes``).

A sample is the CUDA-event time of one step, from the copy of its inputs to the device
to the copy of its next tokens back (host time on the CPU); the host time around the
whole call is kept too, and their difference, the host work outside the GPU's part
(packing the inputs, the final synchronize), is kept per composition on a GPU (the
median, column ``host_overhead_ms_p50``) and as the sidecar's ``step_overhead_us`` (the
median over compositions).
Then the *first-call phase* (:func:`_first_calls`, with fresh shapes): eager steps at 40
token counts as far as can be from every count run, each timed twice; the sidecar's
``first_call`` keeps the mean of first less second (steps are priced by their means), and
the CSV's ``fresh_samples`` how many of each composition's samples ran at a new count;
schedsim.cost.step_model can price both.
Afterwards it times KV block swaps (pinned host memory <-> device) and stamps the
machine. With ``host_variation_s`` it also times the cheapest composition in five rounds
(:func:`_host_variation`): the sidecar's ``host_variation`` record, from which the LLM
prediction band draws a host-speed factor per replication, as for request-level profiles. Ctrl-C, an error or an out-of-memory step still write the compositions already
sampled, marked ``"partial": true``.

The grid (:func:`step_grid`) covers what the simulator asks of a 1B model on one GPU:
decode batches 1..256 at the CUDA-graph sizes and a few between them, contexts 16 to
196608 where the batch's KV fits a budget; prefill chunks 16..8192 over contexts up to
188416 (chunked prefill of long prompts); and mixed steps. Decode contexts avoid exact
powers of two of blocks, so whether a caller counts a decode's own token in
:func:`~schedsim.cost.llm_shapes.context_blocks` or not, the padded width is the same.

Imports neither simpy nor the simulator: it runs on a measuring machine with numpy and torch
(scipy for the sidecar's fit). ``python -m schedsim.profiling.step_profiler`` takes the same flags
as ``schedsim profile llm`` without typer and rich (:func:`main`).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES
from schedsim.cost.step_fit import fit_step_profile
from schedsim.cost.step_profile import FIRST_CALL_KEY, FRESH_COLUMN, HOST_COLUMN, KV_COLUMN, SCHEMA, load_step_profile
from schedsim.errors import InputError
from schedsim.files import replaced_atomically, write_json
from schedsim.live.engines.base import is_out_of_memory, require
from schedsim.live.loop_overhead import measure_loop_overhead
from schedsim.profiling.host import pin_cpu
from schedsim.profiling.measure import gpu_state, machine_metadata, summarize
from schedsim.profiling.profiler import Interrupted, Outcome
from schedsim.profiling.step_grid import Composition, step_grid

KEY_COLUMNS = ("prefill_seqs", "prefill_chunk", "prefill_context", "decode_seqs", "decode_context")
STAT_COLUMNS = ("latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99",
                "latency_ms_std", "n")
DTYPES = ("fp32", "fp16", "bf16")

@dataclass(frozen=True)
class StepProfileSpec:
    """What to measure and how; validated by :meth:`check`."""

    model: str = "builtin:llama-1b"
    """``builtin:NAME`` of a decoder in :mod:`schedsim.live.engines.decoder`."""
    dtype: str = "bf16"
    """fp32, fp16 or bf16."""
    device: str | None = None
    """'cuda', 'cuda:N' or 'cpu' (default: cuda when available)."""
    cuda_graphs: bool = True
    """Replay decode-only steps as CUDA graphs (on CUDA)."""
    block_size: int = 16
    """Tokens per KV block."""
    max_context: int = 196608
    """Leave out compositions whose longest request exceeds this."""
    quick: bool = False
    """A small grid and short sampling (a smoke test; seconds on the CPU with llama-tiny)."""
    compositions: tuple | None = None
    """Measure these instead of :func:`step_grid`'s."""
    warmup_calls: int = 2
    """Warm-up calls per composition, after the first (prepare) call."""
    min_samples: int = 15
    """Samples per composition the sampling rounds aim for."""
    max_time_s: float = 240.0
    """Cap on the sampling phase, s; compositions short of ``min_samples`` are then flagged."""
    visit_ms: float = 4.0
    """A visit takes back-to-back samples until about this long (1 to 8 samples)."""
    swap_blocks: int = 512
    """Blocks per swap copy timed for ``swap_gb_per_s``."""
    fresh_shapes: bool = True
    """Time each sample of a step with a prefill chunk at a token count the engine has not
    run before, as a server meets it (module docstring); False: the nominal shape, warm."""
    seed: int = 0
    """Seed for weights, token ids and the visiting order."""
    host_variation_s: float = 0.0
    """Seconds per round of the host-variation measurement (5 rounds of the cheapest
    composition; 0 skips it): :mod:`schedsim.profiling.host_variation`, the sidecar's
    ``host_variation``, which the LLM prediction band reads."""

    def check(self) -> None:
        if not self.model.startswith("builtin:"):
            raise InputError(f"--model {self.model}: the step profiler runs builtin decoders "
                             f"(builtin:llama-1b, builtin:llama-tiny)")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype {self.dtype}: expected one of {', '.join(DTYPES)}")
        for name in ("block_size", "max_context", "min_samples", "swap_blocks"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if not self.host_variation_s >= 0:
            raise InputError(f"--host-variation-s {self.host_variation_s}: must be >= 0")
        if self.max_time_s <= 0 or self.warmup_calls < 0:
            raise InputError(f"--max-time-s {self.max_time_s} must be > 0 and warm-up calls "
                             f"{self.warmup_calls} >= 0")

    def grid(self) -> list[Composition]:
        if self.compositions is not None:
            return [c if isinstance(c, Composition) else Composition(*c) for c in self.compositions]
        return step_grid(self.max_context, quick=self.quick)

    def jitter(self, c: Composition) -> int:
        """How far (tokens, in all) a sample may move the composition's prefill chunks."""
        return jitter_tokens(c.prefill_chunk) if self.fresh_shapes and c.prefill_seqs else 0


def jitter_tokens(chunk: int) -> int:
    """Half-width of the band of token counts a fresh-shape sample of a ``chunk``-token
    prefill picks from: +-8 at small chunks (a step's cost hardly depends on their length),
    a quarter of the chunk up to +-64 (3% of 2048), and never below 2 tokens a chunk."""
    return max(0, min(max(8, chunk // 4), 64, chunk - 2))


def spec_from_flags(*, quick: bool = False, min_samples: int | None = None,
                    max_time_s: float | None = None, **flags) -> StepProfileSpec:
    """The spec the command line asks for: ``--quick`` samples less where no flag says."""
    return StepProfileSpec(
        quick=quick, warmup_calls=1 if quick else 2,
        min_samples=min_samples if min_samples is not None else (5 if quick else 15),
        max_time_s=max_time_s if max_time_s is not None else (3.0 if quick else 240.0),
        swap_blocks=64 if quick else 512, **flags)


class StepProgress:
    """Callbacks the profiler makes; the default does nothing."""

    def phase(self, name: str, total: int) -> None: ...
    def update(self, completed: int, text: str = "") -> None: ...
    def note(self, text: str) -> None: ...


class PlainStepProgress(StepProgress):
    """Phase lines and a line every tenth of a phase on stderr, for logs."""

    def __init__(self):
        self._name, self._total, self._next, self._t0 = "", 1, 0, 0.0

    def phase(self, name, total):
        self._name, self._total, self._next, self._t0 = name, max(total, 1), 0, time.perf_counter()
        print(f"[llm profile] {name}: {total} to do", file=sys.stderr, flush=True)

    def update(self, completed, text=""):
        if completed >= self._next:
            print(f"[llm profile] {self._name}: {completed}/{self._total} "
                  f"({time.perf_counter() - self._t0:.0f} s) {text}", file=sys.stderr, flush=True)
            self._next = completed + max(self._total // 10, 1)

    def note(self, text):
        print(f"[llm profile] {text}", file=sys.stderr, flush=True)


@dataclass
class _Cell:
    comp: Composition
    rows: list
    """The engine rows at the nominal shape; prefill rows hold ``jitter`` more tokens (and blocks)."""
    jitter: int = 0
    """Tokens a fresh-shape sample may move the prefill chunks by, in all (0: never)."""
    gpu_ms: list = field(default_factory=list)
    host_ms: list = field(default_factory=list)
    graph: bool = False
    per_visit: int = 1
    error: str | None = None
    drift: int = 0
    """Sum of the fresh-shape moves so far: the next one leans the other way."""
    fresh: int = 0
    """Samples taken at a fresh token count."""

    def nominal_rows(self) -> list:
        return self.rows_moved(0) if self.jitter else self.rows

    def rows_moved(self, delta: int) -> list:
        """The rows with the prefill chunks ``delta`` tokens longer in all (spread evenly)."""
        s, q = self.comp.prefill_seqs, self.comp.prefill_chunk
        if not s:
            return self.rows
        moved = [replace(r, tokens=r.tokens[:q + delta // s + (i < delta % s)])
                 for i, r in enumerate(self.rows[:s])]
        return moved + self.rows[s:]


class _FreshShapes:
    """Step token counts the engine has run eagerly; picks an unseen one for each sample."""

    def __init__(self, cells: list[_Cell]):
        # Decode graphs replay captured kernels: their token counts choose nothing.
        self.seen = {c.comp.tokens for c in cells if not c.graph}

    def move(self, cell: _Cell) -> int:
        """The smallest move of the cell's chunks, within its jitter, to an unseen token
        count: first on the side that brings the cell's mean move back to 0; 0 (the warm
        nominal shape) when the band is used up."""
        toward = -1 if cell.drift > 0 else 1
        for side in (toward, -toward):
            for d in range(side, side * (cell.jitter + 1), side):
                if cell.comp.tokens + d not in self.seen:
                    self.seen.add(cell.comp.tokens + d)
                    cell.drift += d
                    cell.fresh += 1
                    return d
        return 0


# -- the run -------------------------------------------------------------------------------

def run_step_profile(spec: StepProfileSpec, out: str | os.PathLike,
                     progress: StepProgress | None = None, command: str | None = None,
                     cpu_pinning: dict | None = None) -> Outcome:
    """Measure every composition of ``spec`` and write ``out`` (CSV) and its JSON sidecar.

    After the compositions, the live loop's own host time per step on this engine
    (:func:`~schedsim.live.loop_overhead.measure_loop_overhead`; sidecar keys
    ``loop_overhead_us`` and ``loop_overhead_us_per_row``). ``cpu_pinning``: the record of
    :func:`schedsim.profiling.host.pin_cpu`, kept in the sidecar.

    On Ctrl-C or an error the compositions already sampled are written as a partial
    profile first; then the exception propagates (out of memory becomes an InputError,
    Ctrl-C :class:`~schedsim.profiling.profiler.Interrupted`).
    """
    spec.check()
    out = Path(out)
    if out.suffix.lower() != ".csv":
        raise InputError(f"--out {out}: must name a .csv file (the sidecar goes next to it)")
    torch = require("torch", "torch", "the LLM step profiler")
    from schedsim.live.engines import decoder  # lazy: the engine modules import torch (seconds), after CPU pinning
    # lazy: imports torch (seconds), after CPU pinning
    from schedsim.live.engines.llm_engine import EngineRow, PagedLLMEngine

    name = spec.model.split(":", 1)[1]
    if name not in decoder.CONFIGS:
        raise InputError(f"--model {spec.model}: unknown; builtin decoders are "
                         f"{', '.join('builtin:' + n for n in sorted(decoder.CONFIGS))}")
    cfg = decoder.CONFIGS[name]
    device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: torch {torch.__version__} sees no CUDA GPU")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
    grid = spec.grid()
    if not grid:
        raise InputError(f"--max-context {spec.max_context}: leaves no composition to measure")
    bs = spec.block_size
    num_blocks = max(max(c.blocks(bs, spec.jitter(c)) for c in grid), spec.swap_blocks) + 1
    max_ctx = max(c.longest + spec.jitter(c) for c in grid)
    command = command or shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    progress = progress or StepProgress()
    rng = np.random.default_rng(spec.seed)
    gpu_before = gpu_state() if device.startswith("cuda") else None
    started = datetime.now(timezone.utc)
    cells: list[_Cell] = []
    failed: dict = {}
    extras: dict = {"warnings": [], "rounds": 0, "truncated": False}
    error: BaseException | None = None
    describe: dict = {}
    kv_bytes = 0
    with torch.inference_mode():
        try:
            with PagedLLMEngine(name, num_blocks, bs, device, dtype, spec.cuda_graphs, spec.seed,
                                max_context=max_ctx) as eng:
                describe, kv_bytes = eng.describe(), eng.kv_bytes_per_token
                cells = [_Cell(c, _rows(c, bs, cfg.vocab, rng, EngineRow, spec.jitter(c)), spec.jitter(c))
                         for c in grid]
                _prepare_all(eng, cells, failed, progress, is_out_of_memory, torch)
                live = [c for c in cells if c.error is None]
                _warm_up(eng, live, spec, rng, progress)
                seen = _sample(eng, live, spec, rng, progress, extras)
                if spec.fresh_shapes and any(not c.graph for c in live):
                    progress.phase("first calls", FIRST_CALL_STEPS)
                    extras["first_call"] = _first_calls(eng, seen, bs, cfg.vocab, rng, EngineRow, progress)
                progress.phase("swap and overhead", 1)
                extras["swap"] = _swap_rate(eng, spec)
                extras["prepare_us"] = _prepare_times(eng, live)
                progress.phase("live loop overhead", 1)
                extras["loop"] = measure_loop_overhead(engine=eng, steps=200)
                if extras["loop"] is None:
                    extras["warnings"].append("live loop overhead not measured: the KV pool holds "
                                              "fewer than two of its bursts")
                extras["engine_warnings"] = list(eng.warnings)
                extras["graph_shapes"] = len(eng.graph_shapes)
                progress.update(1)
                if spec.host_variation_s > 0 and live:
                    extras["host_variation"] = _host_variation(eng, live, spec, progress)
        except BaseException as exc:  # noqa: BLE001 - keep the samples, then re-raise
            error = exc
    cells = [c for c in cells if c.error is None]
    if error is not None and not any(c.gpu_ms for c in cells):
        if is_out_of_memory(error):
            raise InputError(f"out of memory before any step was measured "
                             f"({_first_line(error)})") from None
        raise error
    extras["cpu_pinning"] = cpu_pinning
    outcome = _write(spec, out, cells, failed, extras, describe, kv_bytes, name, device, dtype,
                     torch, num_blocks, started, gpu_before, command, error)
    if error is not None:
        if is_out_of_memory(error):
            raise InputError(f"device out of memory: {_kept(outcome)}") from None
        if isinstance(error, KeyboardInterrupt):
            raise Interrupted(outcome) from None
        error.add_note(f"schedsim profile llm: {_kept(outcome)}")
        raise error
    return outcome


def _rows(c: Composition, bs: int, vocab: int, rng: np.random.Generator, EngineRow, extra: int = 0) -> list:
    """The engine rows of a composition, each with its own blocks (sequential from 1); the
    prefill rows ``extra`` tokens longer (:meth:`_Cell.rows_moved` cuts them)."""
    rows, nxt = [], 1
    specs = ([(c.prefill_chunk + extra, c.prefill_context)] * c.prefill_seqs
             + [(1, ctx) for ctx in c.row_contexts])
    for n, ctx in specs:
        nb = -(-(ctx + n) // bs)
        rows.append(EngineRow(rng.integers(1, vocab, size=n), ctx, np.arange(nxt, nxt + nb)))
        nxt += nb
    return rows


def _prepare_all(eng, cells, failed, progress, is_oom, torch) -> None:
    """One call each, largest first: captures decode graphs, finds steps that do not fit."""
    order = sorted(range(len(cells)), key=lambda i: -cells[i].comp.kv_tokens)
    progress.phase("prepare (graph capture)", len(cells))
    for done, i in enumerate(order, 1):
        cell = cells[i]
        try:
            eng.execute(cell.nominal_rows())
            cell.graph = eng.last_graph
        except Exception as exc:  # noqa: BLE001 - out of memory: skip this composition
            if not is_oom(exc):
                raise
            cell.error = _first_line(exc)
            failed[cell.comp.label] = cell.error
            if eng.is_cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            progress.note(f"out of memory, skipped: {cell.comp.label}")
        progress.update(done, cell.comp.label)


def _timed(eng, rows) -> tuple[float, float]:
    t0 = time.perf_counter_ns()
    eng.execute(rows)
    host = (time.perf_counter_ns() - t0) * 1e-6
    gpu = eng.last_gpu_ms
    return (host if np.isnan(gpu) else gpu), host


def _warm_up(eng, cells, spec: StepProfileSpec, rng, progress) -> None:
    progress.phase("warm-up", len(cells))
    for done, i in enumerate(rng.permutation(len(cells)), 1):
        cell = cells[i]
        best = float("inf")
        rows = cell.nominal_rows()
        for _ in range(max(spec.warmup_calls, 1)):
            best = min(best, _timed(eng, rows)[1])
        cell.per_visit = int(np.clip(spec.visit_ms // max(best, 1e-3), 1, 8))
        progress.update(done, cell.comp.label)


def _sample(eng, cells, spec: StepProfileSpec, rng, progress, extras) -> set[int]:
    """Rounds over all compositions in random orders until the targets hold or time runs out.
    Returns the step token counts the engine has run eagerly (what a first call avoids)."""
    target = spec.min_samples
    progress.phase("sampling", len(cells) * target)
    deadline = time.perf_counter_ns() + int(spec.max_time_s * 1e9)
    fresh = _FreshShapes(cells)
    while min(len(c.gpu_ms) for c in cells) < target:
        if time.perf_counter_ns() >= deadline:
            extras["truncated"] = True
            break
        for i in rng.permutation(len(cells)):
            cell = cells[i]
            for _ in range(cell.per_visit):
                rows = cell.rows_moved(fresh.move(cell)) if cell.jitter else cell.rows
                gpu, host = _timed(eng, rows)
                cell.gpu_ms.append(gpu)
                cell.host_ms.append(host)
        extras["rounds"] += 1
        progress.update(sum(min(len(c.gpu_ms), target) for c in cells),
                        f"round {extras['rounds']}")
    return fresh.seen


def _host_variation(eng, cells, spec: StepProfileSpec, progress) -> dict:
    """How the host's speed moves between and within runs (5 rounds of
    ``spec.host_variation_s`` seconds): :func:`schedsim.profiling.host_variation.measure`
    on the composition with the smallest median sample, timed by the host clock around
    ``execute``. The cheapest step is the most launch-bound one (on a GPU, one decode row
    replayed as a graph), so its wall time moves with the host's speed, which is what a
    slower or busier host changes in a live LLM run (docs/validation/host-variation.md)."""
    from schedsim.profiling.host_variation import measure

    cell = min(cells, key=lambda c: float(np.median(c.gpu_ms)) if c.gpu_ms else float("inf"))
    rows = cell.nominal_rows()
    s = spec.host_variation_s
    progress.phase("host variation", 1)
    progress.note(f"host variation: 5 rounds of {s:g} s of {cell.comp.label}")
    record = measure(lambda: (eng.execute(rows), None)[1], rounds=5, round_s=s, window_s=min(0.25, s / 4),
                     pause_s=min(0.5, s / 4), what=f"one step of {cell.comp.label}, wall time around execute()")
    progress.update(1)
    return record


def _swap_rate(eng, spec: StepProfileSpec, reps: int = 5) -> dict:
    """Pinned host <-> device copies of ``swap_blocks`` blocks (all layers, K and V)."""
    n = min(spec.swap_blocks, eng.num_blocks - 1)
    ids = np.arange(1, n + 1)
    nbytes = n * eng.block_size * eng.kv_bytes_per_token
    outs, ins = [], []
    handle = eng.swap_out(ids)  # first copy: allocates and pins
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        handle = eng.swap_out(ids)
        outs.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        eng.swap_in(handle, ids)
        ins.append(time.perf_counter_ns() - t0)
    out_s, in_s = np.median(outs) * 1e-9, np.median(ins) * 1e-9
    return {"blocks": n, "bytes": int(nbytes), "reps": reps,
            "out_gb_per_s": nbytes / out_s / 1e9, "in_gb_per_s": nbytes / in_s / 1e9,
            "what": "host clock around swap_out (device gather of the blocks of every layer, "
                    "copy to a freshly pinned host tensor, synchronize) and swap_in (copy "
                    "to the device, scatter into the blocks, synchronize); median of reps"}


def _prepare_times(eng, cells, reps: int = 50) -> dict:
    """Host time of the engine's input packing alone, for the largest decode, prefill and mixed step."""
    out = {}
    for kind in ("decode", "prefill", "mixed"):
        of_kind = [c for c in cells if c.comp.kind == kind]
        if not of_kind:
            continue
        cell = max(of_kind, key=lambda c: (len(c.rows), c.comp.kv_tokens))
        rows = cell.nominal_rows()
        eng.prepare(rows)
        t = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            eng.prepare(rows)
            t.append(time.perf_counter_ns() - t0)
        out[kind] = {"composition": cell.comp.label, "median_us": float(np.median(t)) * 1e-3}
    return out


# -- writing -------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _kept(outcome: Outcome) -> str:
    if outcome.path is None:
        return "no composition was sampled, nothing written"
    return f"kept {outcome.cells} measured compositions in {outcome.path} (marked partial)"


def _fit(csv_path: Path):
    """:func:`~schedsim.cost.step_fit.fit_step_profile` of the profile just written (its ``fit`` entry).

    Loading it back with the cost model's own reader also checks that the files are
    what the simulator reads. Returns (fit, None) or (None, why not).
    """
    try:
        return fit_step_profile(load_step_profile(csv_path)).to_dict(), None
    except Exception as exc:  # noqa: BLE001 - the profile stands without a fit
        return None, f"fit_step_profile failed: {type(exc).__name__}: {exc}"


def _write(spec, out: Path, cells, failed, extras, describe, kv_bytes, name, device, dtype, torch,
           num_blocks, started, gpu_before, command, error) -> Outcome:
    complete = error is None and not failed
    sampled = [c for c in cells if c.gpu_ms]
    warnings = list(extras.get("engine_warnings", [])) + list(extras.get("warnings", []))
    rows, unstable, spread = [], 0, []
    overhead = {"decode": [], "prefill": [], "mixed": []}
    for c in sampled:
        st = summarize(c.gpu_ms)
        row = dict(zip(KEY_COLUMNS, c.comp.key()))
        row[KV_COLUMN] = c.comp.decode_kv_tokens
        row.update({k: st[k] for k in STAT_COLUMNS})
        row[FRESH_COLUMN] = c.fresh
        rows.append(row)
        spread.append(st["latency_ms_std"] / st["latency_ms_mean"] if st["latency_ms_mean"] else 0.0)
        if st["unstable"]:
            unstable += 1
            warnings.append(f"{c.comp.label} unstable: {st['unstable_reason']}")
        if device.startswith("cuda"):
            host_ms = float(np.median(np.subtract(c.host_ms, c.gpu_ms)))
            overhead[c.comp.kind].append(host_ms * 1e3)
            # Per composition too: the host work grows with the rows and table entries packed.
            row[HOST_COLUMN] = max(host_ms, 0.0)
    short = [c.comp.label for c in sampled if len(c.gpu_ms) < spec.min_samples]
    if short:
        warnings.append(f"{len(short)} compositions have fewer than {spec.min_samples} samples "
                        f"(sampling stopped at --max-time-s={spec.max_time_s})")
    for label, why in failed.items():
        warnings.append(f"not measured (out of memory): {label}: {why}")
    drift = _drift(sampled)
    if drift is not None and abs(drift["median_change"]) > 0.05:
        warnings.append(f"drift: the median composition moved {drift['median_change']:+.1%} "
                        f"from the first to the last third of its samples")
    machine = machine_metadata(gpu_before, probe_torch=True)
    warnings += machine["warnings"]
    missing = [c.comp.label for c in cells if not c.gpu_ms] + list(failed)
    if not complete:
        reason = ("interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else
                  f"stopped by an error: {type(error).__name__}: {_first_line(error)}" if error
                  else "some compositions did not fit in memory")
        warnings.insert(0, f"PARTIAL PROFILE: {reason}; {len(sampled)} of "
                           f"{len(sampled) + len(missing)} compositions")
    is_cuda = device.startswith("cuda")
    dev_name = torch.cuda.get_device_name(torch.device(device)) if is_cuda else _cpu_name()
    step_overhead = None
    if is_cuda:
        allc = [v for vs in overhead.values() for v in vs]
        step_overhead = float(np.median(allc)) if allc else None
    elif extras.get("prepare_us"):
        step_overhead = float(np.median([v["median_us"] for v in extras["prepare_us"].values()]))
    swap = extras.get("swap")
    meta = {
        "schema": SCHEMA,
        "partial": not complete,
        # Provenance (flat, as schedsim.cost.step_profile reads cuda_graphs from the top level).
        "device": dev_name,
        "backend": "torch",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if is_cuda else None,
        "driver": machine.get("driver"),
        "model": f"builtin:{name}",
        "model_description": _description(name),
        "dtype": spec.dtype,
        "cuda_graphs": bool(describe.get("cuda_graphs", False)),
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "command": command,
        "seed": spec.seed,
        "block_size": spec.block_size,
        "cuda_graph_batch_sizes": list(CUDA_GRAPH_BATCH_SIZES),
        "max_context_measured": max((c.comp.longest for c in sampled), default=0),
        "kv_bytes_per_token": kv_bytes,
        "kv_pool_blocks": num_blocks,
        "swap_gb_per_s": (None if swap is None else
                          float(2 / (1 / swap["out_gb_per_s"] + 1 / swap["in_gb_per_s"]))),
        "swap": swap,
        "step_overhead": {
            "what": ("median over compositions of the per-step median of host time around "
                     "execute() minus its CUDA-event time: packing the inputs on the host "
                     "before the first event, and the synchronize after the last"
                     if is_cuda else "host time of the engine's input packing (prepare) alone"),
            "by_kind_us": {k: (float(np.median(v)) if v else None) for k, v in overhead.items()},
            "prepare_us": extras.get("prepare_us"),
        },
        "timing": ("latency_ms_* are CUDA-event times of one step on the engine's stream: H2D "
                   "copy of the packed inputs, the forward (a CUDA-graph replay for decode-only "
                   "steps at up to 256 sequences, else eager), argmax, D2H copy of the next tokens"
                   if is_cuda else "latency_ms_* are host times of one execute() call (CPU)"),
        "attention": ("prefill chunks: one SDPA call per row over context + chunk (lower-right "
                      "causal); decodes: blocks gathered into a padded [rows, width, kv_heads, "
                      "head_dim] (rows shorter than the longest read the null block for the "
                      "rest), one SDPA call with a length mask; graph steps pad the batch to "
                      "the next CUDA-graph size and the width to a power of two of blocks >= 16 "
                      "(schedsim.cost.llm_shapes)"),
        "sampling": {
            "order": "prepare largest first; warm-up and sampling rounds in seeded random "
                     "orders over all compositions (interleaved)",
            "warmup_calls": spec.warmup_calls, "min_samples": spec.min_samples,
            "max_time_s": spec.max_time_s, "visit_ms": spec.visit_ms,
            "rounds": extras.get("rounds", 0), "truncated": extras.get("truncated", False),
            "shapes": "fresh" if spec.fresh_shapes else "warm",
            "fresh_shapes": _fresh_record(spec, sampled),
        },
        "stability": {
            "unstable_compositions": unstable,
            "median_std_over_mean": float(np.median(spread)) if spread else None,
            "max_std_over_mean": float(np.max(spread)) if spread else None,
        },
        "drift": drift,
        "graph_shapes_captured": extras.get("graph_shapes"),
        "decode_compositions_eager": [c.comp.label for c in sampled
                                      if c.comp.kind == "decode" and not c.graph and is_cuda
                                      and describe.get("cuda_graphs")],
        "engine": describe,
        "machine": machine,
        # What schedsim.cost.step_model's serial-keys feature needs: the eager decode attention's
        # kernel blocks per (row, KV head) and split rule, and the multiprocessors they share.
        "decode_attention": ({"kv_heads": describe["kv_heads"], "split_ctas": describe["decode_split_ctas"],
                              "min_split_blocks": describe["min_split_blocks"],
                              "multiprocessors": machine["gpu_multiprocessors"]}
                             if is_cuda and machine.get("gpu_multiprocessors") and "kv_heads" in describe
                             else None),
        "cpu_pinning": extras.get("cpu_pinning"),
        FIRST_CALL_KEY: extras.get("first_call"),
        "warnings": warnings,
    }
    if extras.get("host_variation"):
        meta["host_variation"] = extras["host_variation"]
    if extras.get("loop"):
        meta.update(extras["loop"])
    if step_overhead is not None:
        meta["step_overhead_us"] = step_overhead
    if meta["swap_gb_per_s"] is None:
        del meta["swap_gb_per_s"]
    if not complete:
        meta["missing_compositions"] = missing
        if failed:
            meta["failed_compositions"] = failed
    if not rows:
        return Outcome(None, False, 0, warnings, _first_line(error) if error else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(out) as tmp:
        with open(tmp, "w", newline="") as f:
            host = (HOST_COLUMN,) if rows and HOST_COLUMN in rows[0] else ()
            w = csv.DictWriter(f, fieldnames=list(KEY_COLUMNS + (KV_COLUMN,) + STAT_COLUMNS + host + (FRESH_COLUMN,)))
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    sidecar = out.with_suffix(".json")
    if not complete:
        meta["fit_skipped"] = "partial profile: not fitted"
    write_json(sidecar, meta)
    if complete:
        fit, why = _fit(out)
        if fit is not None:
            meta["fit"] = fit
        else:
            meta["fit_skipped"] = why
        write_json(sidecar, meta)
    return Outcome(out, complete, len(rows), warnings, _first_line(error) if error else None)


def _fresh_record(spec: StepProfileSpec, cells) -> dict:
    """How many samples of steps with a prefill chunk ran at a token count new to the engine."""
    eager = [c for c in cells if c.comp.prefill_seqs]
    samples = sum(len(c.gpu_ms) for c in eager)
    fresh = sum(c.fresh for c in eager)
    return {
        "what": ("each sample of a step with a prefill chunk moves its chunks (in all) by the "
                 "smallest amount within +-jitter_tokens(chunk) to a step token count the engine "
                 "has not run, alternately up and down (prefill_chunk in the CSV is the nominal "
                 "chunk); a sample whose band is used up runs the nominal (warm) shape"
                 if spec.fresh_shapes else
                 "--warm-shapes: every sample at the nominal shape, which the engine has run before"),
        "jitter_tokens": "max(0, min(max(8, chunk // 4), 64, chunk - 2))",
        "samples": samples, "fresh_samples": fresh, "warm_samples": samples - fresh,
        "compositions_all_fresh": sum(1 for c in eager if c.gpu_ms and c.fresh == len(c.gpu_ms)),
        "mean_move_tokens_max_abs": max((abs(c.drift) / len(c.gpu_ms) for c in eager if c.gpu_ms), default=0.0),
    }


FIRST_CALL_STEPS = 40
"""Token counts the first-call phase times (each twice)."""
FIRST_CALL_SHAPE = (4, 2000, 140, 2000)
"""(decodes, their context, fewest and most tokens in all) of the first-call phase's steps:
one prefill beside a few decodes, as a lightly loaded server runs."""


def _first_calls(eng, seen: set, bs: int, vocab: int, rng, EngineRow, progress) -> dict:
    """What an eager step pays the first time the engine runs its token count: for
    :data:`FIRST_CALL_STEPS` counts, each as far as can be from every count run before
    (the sampling's own included), one step timed twice; the first call less the second.

    Measured on the H200: +3.3 ms at the median (4.2 ms mean) for a new count (1 prefill +
    4 decodes, 140-2,000 tokens), +0.05 ms for a count run before, whether the new one is
    next to a count run or far from any (experiments/fidelity-llm/diagnose_first_call_distance.py):
    per exact count, not per band of counts.
    """
    decodes, ctx, lo, hi = FIRST_CALL_SHAPE
    # A small engine (a quick CPU profile) gets shorter steps: they must fit its context and pool.
    ctx, hi = min(ctx, eng.max_context - 2), min(hi, eng.max_context)
    while hi > 2 * decodes and -(-hi // bs) + decodes * -(-(ctx + 1) // bs) > eng.num_blocks - 1:
        ctx, hi = ctx // 2, hi // 2
    lo = min(lo, max(hi // 2, decodes + 2))
    candidates = np.arange(lo, hi + 1)
    first, second = [], []
    for done in range(1, FIRST_CALL_STEPS + 1):
        run = np.array(sorted(seen))
        dist = np.min(np.abs(candidates[:, None] - run[None, :]), axis=1) if run.size else candidates
        m = int(rng.choice(candidates[dist == dist.max()]))
        comp = Composition(1, m - decodes, 0, decodes, ctx)
        rows = _rows(comp, bs, vocab, rng, EngineRow)
        first.append(_timed(eng, rows)[0])
        second.append(_timed(eng, rows)[0])
        seen.add(m)
        progress.update(done)
    extra = np.subtract(first, second)
    # The mean, as the model prices every step by its mean: the extra is skewed (on the H200
    # median 3.3 ms, mean 4.2 ms in experiments/fidelity-llm/diagnose_first_call_distance.py).
    return {"priced": False,   # measured, not priced: schedsim.cost.step_model's module docstring says why
            "what": ("an eager step (1 prefill + %d decodes at %d tokens, %d-%d tokens in all) at a token count "
                     "new to the engine, timed twice: first call less second; the mean over %d counts"
                     % (decodes, ctx, lo, hi, len(extra))),
            "ms": max(float(np.mean(extra)), 0.0), "median_ms": float(np.median(extra)),
            "p25_ms": float(np.percentile(extra, 25)),
            "p75_ms": float(np.percentile(extra, 75)), "steps": len(extra),
            "first_ms_median": float(np.median(first)), "second_ms_median": float(np.median(second))}


def _drift(cells) -> dict | None:
    """How far each composition's median moved from its first to its last third of samples."""
    changes = []
    for c in cells:
        x = np.asarray(c.gpu_ms)
        k = x.size // 3
        if k >= 2:
            changes.append(float(np.median(x[-k:]) / np.median(x[:k]) - 1.0))
    if not changes:
        return None
    return {"what": "median(last third of samples) / median(first third) - 1, per composition",
            "median_change": float(np.median(changes)), "min_change": float(np.min(changes)),
            "max_change": float(np.max(changes)), "compositions": len(changes)}


def _description(name: str) -> str:
    from schedsim.live.engines.decoder import DESCRIPTIONS  # lazy: imports torch (seconds), after CPU pinning

    return DESCRIPTIONS.get(name, name)


def _cpu_name() -> str:
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def main(argv: list[str] | None = None) -> int:
    """``schedsim profile llm`` for a measuring machine without typer and rich (plain progress)."""
    ap = argparse.ArgumentParser(prog="python -m schedsim.profiling.step_profiler",
                                 description="Measure LLM engine steps into a step profile "
                                             "(the flags of `schedsim profile llm`).")
    spec = StepProfileSpec  # its field defaults are the command's
    ap.add_argument("--model", default=spec.model)
    ap.add_argument("--dtype", default=spec.dtype)
    ap.add_argument("--device", default=spec.device)
    ap.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    ap.add_argument("--block-size", type=int, default=spec.block_size)
    ap.add_argument("--max-context", type=int, default=spec.max_context)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-samples", type=int, default=None)
    ap.add_argument("--max-time-s", type=float, default=None)
    ap.add_argument("--seed", type=int, default=spec.seed)
    ap.add_argument("--warm-shapes", dest="fresh_shapes", action="store_false")
    ap.add_argument("--host-variation-s", type=float, default=spec.host_variation_s)
    ap.add_argument("--cpu", default=None, help="pin to this CPU (a number, or auto: the fastest now)")
    ap.add_argument("--out", type=Path, required=True)
    args = vars(ap.parse_args(argv))
    out, cpu = args.pop("out"), args.pop("cpu")
    try:
        pinned = pin_cpu(cpu)
        outcome = run_step_profile(spec_from_flags(**args), out, PlainStepProgress(), cpu_pinning=pinned)
    except InputError as exc:
        print(f"schedsim: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted:
        return 130
    for w in outcome.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {outcome.path} ({outcome.cells} step compositions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
