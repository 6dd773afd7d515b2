"""Step profile files: the measured step times an LLM step cost model is fitted to.

A step profile is ``NAME.csv`` and the sidecar ``NAME.json`` (reference:
docs/reference/llm-profile-format.md); :class:`StepProfile` is one read and validated.
:mod:`schedsim.cost.step_fit` fits the step model to it, :mod:`schedsim.cost.step_model`
prices steps with the fit. The CSV has one row per measured step composition, in the order
measured:

``prefill_seqs, prefill_chunk, prefill_context``
    the step has ``prefill_seqs`` identical prefill chunks of ``prefill_chunk`` tokens
    (>= 2), each over ``prefill_context`` tokens already cached (0, 0, 0 for none);
``decode_seqs, decode_context``
    plus ``decode_seqs`` decodes, each over ``decode_context`` cached tokens (with
    :data:`KV_COLUMN`: the longest decode row's context, which sets the padded width);
``latency_ms_mean, latency_ms_p50, latency_ms_p90, latency_ms_p99, latency_ms_std, n``
    the step's measured time (forward pass, ms) and how many steps were timed;
``host_overhead_ms_p50`` (optional)
    the median host time of the step outside the forward pass (packing the inputs,
    the final synchronize), ms >= 0. With it the model fits forward pass plus host time
    per composition, and the sidecar's single ``step_overhead_us`` is not added: that one
    number is a median over all compositions, and the host work grows with the rows
    and block-table entries packed (on the H200 from 0.20-0.40 ms for 1-8 decodes at
    contexts of 16-100 tokens to 2.6 ms for 256 at 8,000).
``decode_kv_tokens`` (optional, :data:`KV_COLUMN`)
    the KV tokens the decode rows attend over, summed: ``sum of (context + 1)``, between
    ``decode_seqs`` and ``decode_seqs * (decode_context + 1)`` (equal to the latter when
    every row has the longest context). With it the model has a real-KV term
    (:mod:`schedsim.cost.step_model`).

The sidecar (schema ``schedsim.step_profile/1``) holds provenance (device, backend,
torch version, model, dtype, cuda_graphs, date, command) and what the model reads:
``block_size`` (default 16), ``cuda_graph_batch_sizes`` (default
:data:`~schedsim.cost.llm_shapes.CUDA_GRAPH_BATCH_SIZES`; ``cuda_graphs: false``, at the top
level or under ``provenance``, means none),
``max_context_measured``, ``decode_attention`` (:class:`DecodeAttention`: ``kv_heads``,
``split_ctas``, ``min_split_blocks``, ``multiprocessors``; optional, gives the serial-keys
term), ``swap_gb_per_s`` (host<->device copy bandwidth, GB/s = 1e9
bytes/s, optional), ``step_overhead_us`` (host time per step outside the forward pass,
default 0), ``loop_overhead_us`` and ``loop_overhead_us_per_row`` (the serving loop's
host time per step between engine calls, scheduling and token hand-back:
``loop_overhead_us + loop_overhead_us_per_row * rows``, default 0; measured by
:mod:`schedsim.live.loop_overhead`) and ``fit`` (:meth:`~schedsim.cost.step_fit.StepFit.to_dict`: a record; the model refits the table
on load with the same function and split, so the table is the one source of truth).
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES
from schedsim.errors import InputError, where
from schedsim.files import replaced_atomically

SCHEMA = "schedsim.step_profile/1"
COMPOSITION = ("prefill_seqs", "prefill_chunk", "prefill_context", "decode_seqs", "decode_context")
LATENCY = ("latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99")
COLUMNS = COMPOSITION + LATENCY + ("latency_ms_std", "n")
"""Required columns of a step profile CSV, in the order written."""
HOST_COLUMN = "host_overhead_ms_p50"
"""Optional column: host time per step outside the forward pass (see the module docstring)."""
KV_COLUMN = "decode_kv_tokens"
"""Optional column: the decode rows' KV tokens, sum of (context + 1) (see the module docstring)."""
FRESH_COLUMN = "fresh_samples"
"""Optional column: how many of the ``n`` samples ran at a token count new to the engine
(the rest at the nominal, warm one); with the sidecar's :data:`FIRST_CALL_KEY`, the model
prices the first call of a token count apart (module docstring)."""
FIRST_CALL_KEY = "first_call"
"""Sidecar object: ``ms``, what an eager step costs more the first time the engine runs its
token count, measured by the profiler (new counts timed twice: the mean of the first call
less the second), and ``priced``, whether the model adds it (module docstring)."""
OPTIONAL_COLUMNS = (KV_COLUMN, HOST_COLUMN, FRESH_COLUMN)
"""Optional columns, in the order written."""
LOOP_KEYS = ("loop_overhead_us", "loop_overhead_us_per_row")
"""Sidecar keys: the serving loop's host time per step outside the engine call, a + b * rows
(:mod:`schedsim.live.loop_overhead`)."""
ATTENTION_FIELDS = ("kv_heads", "split_ctas", "min_split_blocks", "multiprocessors", "blocks_per_multiprocessor",
                    "gpu_bound_tokens")
"""The sidecar's :data:`ATTENTION_KEY` object: integers >= 1, the last two optional."""
ATTENTION_REQUIRED = ATTENTION_FIELDS[:4]
ATTENTION_KEY = "decode_attention"
"""Sidecar object: how the engine launches an eager step's decode attention
(:class:`DecodeAttention`), which :func:`serial_keys` needs."""
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class DecodeAttention:
    """How the engine runs an eager step's decode attention (sidecar :data:`ATTENTION_KEY`).

    The memory-efficient SDPA kernel runs one block of threads per (decode row, KV head),
    and sweeps that row's whole padded width in it, unless the width splits into segments
    (:meth:`~schedsim.live.engines.llm_engine.PagedLLMEngine.decode_splits`: batches of at most
    ``split_ctas // 8`` (row, KV head) pairs, widths of an even number of blocks). With
    fewer blocks than the GPU has multiprocessors, the time follows the keys one block
    sweeps, not the keys in all: on the H200 an 8,192-token chunk took 0.8 ms + 1.03 ms per
    1,000 such keys more beside 1-16 decodes (30 ms for one decode at 32,000 tokens,
    3 ms at 32,767, which splits; experiments/llm_profile/few-decodes/).
    """

    kv_heads: int
    split_ctas: int
    min_split_blocks: int
    multiprocessors: int
    blocks_per_multiprocessor: int = field(default=1, repr=False)   # out of repr: table_digest
    """Kernel blocks resident on one multiprocessor at once: a wave is ``multiprocessors x
    blocks_per_multiprocessor`` blocks. Optional in the sidecar, default 1. PyTorch's
    memory-efficient kernel is built for 16 warps per multiprocessor in 16-bit types on sm80
    and later, in blocks of 4 warps, which makes 4; refitting the committed H200 profile
    with 4 moved its held-out error from 5.42% to 5.33% but the LLM fidelity table's median
    error up (experiments/fidelity-llm/README.md), so the profiler leaves it out."""
    gpu_bound_tokens: int = field(default=0, repr=False)   # out of repr: table_digest
    """Eager steps of more tokens than this are bound by their GPU work, not their launches:
    their decode attention, when its blocks leave multiprocessors idle, adds its serial keys'
    time on top (feature :data:`~schedsim.cost.step_fit.GPU_BOUND_SERIAL_FEATURE`, :func:`~schedsim.cost.step_fit.gpu_bound_serial_keys`).
    Optional in the sidecar; 0 (absent) leaves the feature out. On the H200 a chunk alone took
    7.5 ms at 512 tokens, 8.3 at 1,024, 12.9 at 2,048 and 53 at 8,192: the launches bind up to
    about 1,024 tokens and the work from 2,048 (experiments/fidelity-llm/README.md)."""

    @classmethod
    def from_meta(cls, meta: dict) -> "DecodeAttention | None":
        v = meta.get(ATTENTION_KEY)
        if v is None:
            return None
        return cls(**{k: int(v[k]) for k in ATTENTION_FIELDS if k in v})

    def splits(self, decodes: int, width_blocks: int) -> int:
        """Segments the width is cut into: the engine's decode_splits, restated."""
        s, pairs = 1, decodes * self.kv_heads
        if pairs > self.split_ctas // 8:
            return 1
        while (pairs * s * 2 <= self.split_ctas and width_blocks % (2 * s) == 0
               and width_blocks // (2 * s) >= self.min_split_blocks):
            s *= 2
        return s


@dataclass(frozen=True, eq=False)
class StepProfile:
    """A validated step profile. Build one with :func:`load_step_profile` or :meth:`from_columns`."""

    columns: dict
    """Column name -> read-only numpy array in file order; composition columns and ``n`` int64, latencies float64."""
    meta: dict
    """The sidecar: provenance and settings; empty when there is none."""
    path: Path | None = None
    """The CSV it was read from; None when built in memory."""

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "<memory>"

    def __len__(self) -> int:
        return int(self.columns["n"].shape[0])

    @property
    def block_size(self) -> int:
        """Tokens per KV block the engine used (sidecar ``block_size``, default 16)."""
        return int(self.meta.get("block_size", DEFAULT_BLOCK_SIZE))

    @property
    def cuda_graph_batch_sizes(self) -> tuple[int, ...]:
        """Captured decode batch sizes; () when the engine ran without CUDA graphs."""
        prov = self.meta.get("provenance")
        if self.meta.get("cuda_graphs") is False or (isinstance(prov, dict) and prov.get("cuda_graphs") is False):
            return ()
        return tuple(int(b) for b in self.meta.get("cuda_graph_batch_sizes", CUDA_GRAPH_BATCH_SIZES))

    @property
    def decode_attention(self) -> DecodeAttention | None:
        """How the engine ran eager decode attention (sidecar :data:`ATTENTION_KEY`); None
        without it, and then the model has no :data:`~schedsim.cost.step_fit.SERIAL_FEATURE`."""
        return DecodeAttention.from_meta(self.meta)

    @property
    def first_call_ms(self) -> float | None:
        """What an eager step costs more at a token count new to the engine (sidecar
        :data:`FIRST_CALL_KEY`), where the sidecar sets its ``priced`` and the table has
        :data:`FRESH_COLUMN`; else None (the model then has no first-call term, as before
        it existed). The profiler measures it and leaves ``priced`` false (module docstring)."""
        v = self.meta.get(FIRST_CALL_KEY)
        if not isinstance(v, dict) or v.get("priced") is not True or FRESH_COLUMN not in self.columns:
            return None
        return float(v["ms"])

    @property
    def max_context_measured(self) -> int:
        """The longest KV length (cached plus new tokens) of a row in a measured step: the
        sidecar's ``max_context_measured`` or what the table shows, whichever is larger."""
        c = self.columns
        pre = np.where(c["prefill_seqs"] > 0, c["prefill_context"] + c["prefill_chunk"], 0)
        dec = np.where(c["decode_seqs"] > 0, c["decode_context"] + 1, 0)
        table = int(max(pre.max(), dec.max()))
        return max(table, int(self.meta.get("max_context_measured") or 0))

    @classmethod
    def from_columns(cls, columns: dict, meta: dict | None = None, path=None) -> "StepProfile":
        """Validate in-memory columns (name -> sequence of numbers); rows are named ``row i``."""
        data = {str(k).strip(): np.asarray(v) for k, v in columns.items()}
        src = str(path) if path is not None else "<memory>"
        cols = _validate_table(data, src, lines=None)
        return cls(cols, validate_sidecar(dict(meta or {}), src + " (sidecar)"), None if path is None else Path(path))


def sidecar_path(csv_path) -> Path:
    return Path(csv_path).with_suffix(".json")


def load_step_profile(path: str | os.PathLike) -> StepProfile:
    """Read and validate ``NAME.csv`` and its sidecar ``NAME.json`` (optional)."""
    path = Path(path)
    cols = read_step_table(path)
    meta: dict = {}
    side = sidecar_path(path)
    if side.is_file():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{side}: cannot read sidecar: {e}") from None
        except json.JSONDecodeError as e:
            raise InputError(f"{where(side, e.lineno)}: invalid JSON: {e.msg} (column {e.colno})") from None
        meta = validate_sidecar(meta, str(side))
    return StepProfile(cols, meta, path)


def read_step_table(path: Path) -> dict:
    """The validated columns of a step profile CSV (without its sidecar)."""
    if not path.is_file():
        raise InputError(f"{path}: no such step profile (expected a CSV file)")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: cannot read step profile: {e}") from None
    header = [h.strip() for h in rows[0]] if rows else []
    if not any(header):
        raise InputError(f"{where(path, 1)}: empty step profile, expected a header row with columns "
                         f"{', '.join(COLUMNS)}")
    dup = sorted({h for h in header if h and header.count(h) > 1})
    if dup:
        raise InputError(f"{where(path, 1, dup[0])}: column appears more than once")
    kept = []
    for i, row in enumerate(rows[1:], start=2):
        if not any(f.strip() for f in row):
            continue
        if len(row) != len(header):
            raise InputError(f"{where(path, i)}: {len(row)} fields, the header has {len(header)}")
        kept.append((i, row))
    lines = np.array([i for i, _ in kept], dtype=np.int64)
    data = {name: np.array([row[j] for _, row in kept], dtype=object) for j, name in enumerate(header)}
    return _validate_table(data, str(path), lines)


def _number(v) -> float:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        return float(v)
    t = str(v).strip()
    if not t or not t.isascii() or "_" in t:
        return math.nan
    try:
        return float(t)
    except ValueError:
        return math.nan


def _validate_table(data: dict, src: str, lines) -> dict:
    def loc(i: int, col: str | None = None) -> str:
        if lines is None:
            return f"{where(src, None, col)}: row {i}" if col else f"{src}: row {i}"
        return where(src, int(lines[i]), col)

    missing = [c for c in COLUMNS if c not in data]
    if missing:
        raise InputError(f"{where(src, 1 if lines is not None else None, missing[0])}: missing required column "
                         f"(a step profile needs {', '.join(COLUMNS)})")
    n_rows = len(data[COLUMNS[0]])
    if n_rows == 0:
        raise InputError(f"{src}: step profile has a header but no rows")
    out = {}
    for col in COLUMNS:
        raw = data[col]
        num = np.array([_number(v) for v in raw.tolist()], dtype=np.float64)
        bad = ~np.isfinite(num)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            text = str(raw[i]).strip()
            raise InputError(f"{loc(i, col)}: " + ("missing value" if not text else f"{text!r} is not a finite number"))
        if col in COMPOSITION or col == "n":
            frac = num != np.round(num)
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} is not an integer")
            lo = 1 if col == "n" else 0
            low = num < lo
            if low.any():
                i = int(np.flatnonzero(low)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} must be >= {lo}")
            out[col] = num.astype(np.int64)
        else:
            low = (num < 0) if col == "latency_ms_std" else (num <= 0)
            if low.any():
                i = int(np.flatnonzero(low)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} must be {'>= 0' if col == 'latency_ms_std' else '> 0'} (ms)")
            out[col] = num
    if HOST_COLUMN in data:
        raw = data[HOST_COLUMN]
        num = np.array([_number(v) for v in raw.tolist()], dtype=np.float64)
        bad = ~np.isfinite(num) | (num < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{loc(i, HOST_COLUMN)}: {str(raw[i]).strip()!r} must be a finite number >= 0 (ms)")
        out[HOST_COLUMN] = num
    if KV_COLUMN in data:
        out[KV_COLUMN] = _validated_kv_tokens(data[KV_COLUMN], out, loc)
    if FRESH_COLUMN in data:
        raw = data[FRESH_COLUMN]
        num = np.array([_number(v) for v in raw.tolist()], dtype=np.float64)
        bad = ~np.isfinite(num) | (num != np.round(num)) | (num < 0) | (num > out["n"])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{loc(i, FRESH_COLUMN)}: {str(raw[i]).strip()!r} must be an integer from 0 to n "
                             f"({out['n'][i]})")
        out[FRESH_COLUMN] = num.astype(np.int64)
    for lo, hi in (("latency_ms_p50", "latency_ms_p90"), ("latency_ms_p90", "latency_ms_p99")):
        bad = out[lo] > out[hi]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{loc(i, hi)}: {out[hi][i]:g} is below {lo} ({out[lo][i]:g}); "
                             "percentiles must satisfy p50 <= p90 <= p99")
    empty = (out["prefill_seqs"] == 0) & (out["decode_seqs"] == 0)
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise InputError(f"{loc(i, 'decode_seqs')}: a step needs prefill_seqs or decode_seqs >= 1")
    short = (out["prefill_seqs"] > 0) & (out["prefill_chunk"] < 2)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise InputError(f"{loc(i, 'prefill_chunk')}: {out['prefill_chunk'][i]} must be >= 2 when prefill_seqs > 0 "
                         "(a one-token row is a decode)")
    seen: dict = {}
    key_columns = COMPOSITION + ((KV_COLUMN,) if KV_COLUMN in out else ())
    for i, key in enumerate(zip(*(out[c].tolist() for c in key_columns))):
        if key in seen:
            first = seen[key]
            first_at = f"line {int(lines[first])}" if lines is not None else f"row {first}"
            raise InputError(f"{loc(i, 'prefill_seqs')}: duplicate step composition (first at {first_at})")
        seen[key] = i
    for v in out.values():
        v.flags.writeable = False
    return out


def _validated_kv_tokens(raw, out: dict, loc) -> np.ndarray:
    """:data:`KV_COLUMN` as int64: an integer from ``decode_seqs`` (every row at context 0)
    to ``decode_seqs * (decode_context + 1)`` (every row at the longest)."""
    num = np.array([_number(v) for v in raw.tolist()], dtype=np.float64)
    ds, dc = out["decode_seqs"], out["decode_context"]
    bad = ~np.isfinite(num) | (num != np.round(num))
    if not bad.any():
        bad = (num < ds) | (num > ds * (dc + 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{loc(i, KV_COLUMN)}: {str(raw[i]).strip()!r} must be an integer from decode_seqs "
                         f"({ds[i]}) to decode_seqs * (decode_context + 1) ({ds[i] * (dc[i] + 1)})")
    return num.astype(np.int64)


def validate_sidecar(meta, src: str) -> dict:
    """``meta`` as a step profile's sidecar, validated (``src`` names it in errors)."""
    if not isinstance(meta, dict):
        raise InputError(f"{src}: sidecar must be a JSON object, got {type(meta).__name__}")

    def is_int(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def is_num(v, positive):
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > 0 if positive else v >= 0))

    if meta.get("schema", SCHEMA) != SCHEMA:
        raise InputError(f"{where(src, None, 'schema')}: {meta['schema']!r} is not supported (expected {SCHEMA!r})")
    if "block_size" in meta and not is_int(meta["block_size"], 1):
        raise InputError(f"{where(src, None, 'block_size')}: {meta['block_size']!r} must be an integer >= 1")
    if meta.get("max_context_measured") is not None and not is_int(meta["max_context_measured"], 0):
        raise InputError(f"{where(src, None, 'max_context_measured')}: {meta['max_context_measured']!r} "
                         "must be an integer >= 0")
    if "cuda_graph_batch_sizes" in meta:
        v = meta["cuda_graph_batch_sizes"]
        if not (isinstance(v, list) and all(is_int(b, 1) for b in v) and v == sorted(set(v))):
            raise InputError(f"{where(src, None, 'cuda_graph_batch_sizes')}: {v!r} must be a list of "
                             "increasing integers >= 1")
    if "cuda_graphs" in meta and not isinstance(meta["cuda_graphs"], bool):
        raise InputError(f"{where(src, None, 'cuda_graphs')}: {meta['cuda_graphs']!r} must be true or false")
    if meta.get("swap_gb_per_s") is not None and not is_num(meta["swap_gb_per_s"], True):
        raise InputError(f"{where(src, None, 'swap_gb_per_s')}: {meta['swap_gb_per_s']!r} must be a number > 0 (GB/s)")
    if meta.get(ATTENTION_KEY) is not None:
        v = meta[ATTENTION_KEY]
        required = ATTENTION_REQUIRED
        bad = next((k for k in ATTENTION_FIELDS
                    if not (isinstance(v, dict) and (is_int(v.get(k), 1) or (k not in required and k not in v)))), None)
        if bad is not None:
            optional = " and ".join(k for k in ATTENTION_FIELDS if k not in required)
            raise InputError(f"{where(src, None, ATTENTION_KEY + '.' + bad)}: must be an integer >= 1 "
                             f"(an object with {', '.join(required)} and optionally {optional})")
    if meta.get(FIRST_CALL_KEY) is not None:
        v = meta[FIRST_CALL_KEY]
        if not (isinstance(v, dict) and is_num(v.get("ms"), False)):
            raise InputError(f"{where(src, None, FIRST_CALL_KEY + '.ms')}: must be a number >= 0 (milliseconds; "
                             f"{FIRST_CALL_KEY} is an object with ms)")
        if not isinstance(v.get("priced", False), bool):
            raise InputError(f"{where(src, None, FIRST_CALL_KEY + '.priced')}: {v['priced']!r} must be true or false")
    for key in ("step_overhead_us",) + LOOP_KEYS:
        if meta.get(key) is not None and not is_num(meta[key], False):
            raise InputError(f"{where(src, None, key)}: {meta[key]!r} must be a number >= 0 (microseconds)")
    return meta


def write_step_profile(profile: StepProfile, path: str | os.PathLike, fit: dict) -> StepProfile:
    """Write ``NAME.json`` (the profile's meta with ``schema`` and the ``fit`` record) and ``NAME.csv``.

    Each file is replaced atomically, the CSV last. Returns the profile as it loads from ``path``.
    """
    path = Path(path)
    meta = dict(profile.meta)
    meta["schema"] = SCHEMA
    meta["fit"] = fit
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(sidecar_path(path)) as tmp:
        tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
    with replaced_atomically(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            names = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c in profile.columns)
            w.writerow(names)
            cols = [profile.columns[c].tolist() for c in names]
            for row in zip(*cols):
                w.writerow([v if isinstance(v, int) else repr(float(v)) for v in row])
    return load_step_profile(path)
