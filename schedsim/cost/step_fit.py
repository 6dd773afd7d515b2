"""Fitting the step model to a step profile: its features and their coefficients.

The model's terms are described in :mod:`schedsim.cost.step_model`. The coefficients (:data:`FEATURES`, ms per unit) are fitted by non-negative least squares
on relative error (each row weighted by 1 / its latency) to the profile's mean
latencies. :func:`step_features` computes the features from a step's summary with
arithmetic alone, so the same function builds the fitting matrix, prices one step on
Python integers (:meth:`~schedsim.cost.step_model.StepCostModel.step_ns`) and prices runs of decode steps on
arrays (:meth:`~schedsim.cost.step_model.StepCostModel.decode_run_ns`).

Rows are split in file order (:data:`SPLIT_RULE`): one in :data:`HELD_OUT_EVERY` is held out
and reported as the fit's error, the rest fitted.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedsim.cost.llm_shapes import context_blocks_array, graph_batch_array
from schedsim.cost.step_profile import (COLUMNS, COMPOSITION, FRESH_COLUMN, HOST_COLUMN, KV_COLUMN, DecodeAttention,
                                        StepProfile, load_step_profile, read_step_table, validate_sidecar,
                                        write_step_profile)
from schedsim.errors import InputError

GRAPH_CLASSES = ((1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 30))
"""Captured batch sizes sharing one per-gathered-token rate (inclusive ranges of G)."""
FEATURES = ("graph_step", "graph_batch",
            *(f"graph_kv_tokens_g{lo}_{hi if hi < 1 << 30 else 'up'}" for lo, hi in GRAPH_CLASSES),
            "eager_step", "eager_tokens", "eager_prefill_seqs", "eager_prefill_attention",
            "eager_prefill_context", "eager_decode_seqs", "eager_decode_kv_tokens", "eager_decode_step",
            "eager_tokens_over_knee")
"""Names of the model's features, in :func:`step_features` order, for a profile without :data:`KV_COLUMN`."""
EAGER_KNEE_TOKENS = 1024
"""Tokens beyond which an eager step's own compute outgrows its kernel launches (feature
``eager_tokens_over_knee``): below it a step costs about its launches whatever its size."""
KV_FEATURE = "decode_real_kv_tokens"
"""The feature a profile with :data:`KV_COLUMN` adds, last."""
SERIAL_FEATURE = "eager_decode_serial_keys"
"""The feature a profile whose sidecar has :data:`ATTENTION_KEY` adds, before :data:`KV_FEATURE`."""
GPU_BOUND_SERIAL_FEATURE = "eager_gpu_bound_idle_serial_keys"
"""The feature a profile whose :data:`ATTENTION_KEY` has ``gpu_bound_tokens`` adds, after
:data:`SERIAL_FEATURE`: :func:`gpu_bound_serial_keys`."""

HELD_OUT_EVERY = 5
SPLIT_RULE = "rows in file order; row i (0-based) held out when i % 5 == 4, the rest fitted"


def features_of(columns, attention: "DecodeAttention | None" = None) -> tuple[str, ...]:
    """The features a profile supports: :data:`FEATURES`, then :data:`SERIAL_FEATURE` when
    its sidecar describes the decode attention (and :data:`GPU_BOUND_SERIAL_FEATURE` when
    that gives ``gpu_bound_tokens``), then :data:`KV_FEATURE` when the table has
    :data:`KV_COLUMN`."""
    serial = (SERIAL_FEATURE,) if attention is not None else ()
    if attention is not None and attention.gpu_bound_tokens:
        serial += (GPU_BOUND_SERIAL_FEATURE,)
    return FEATURES + serial + ((KV_FEATURE,) if KV_COLUMN in columns else ())


def gpu_bound_serial_keys(tokens, decodes, decode_width, attention: DecodeAttention, block_size: int):
    """Feature :data:`GPU_BOUND_SERIAL_FEATURE` of eager steps: their :func:`serial_keys` when
    the step has more than ``attention.gpu_bound_tokens`` tokens (its GPU work, not its
    launches, sets its time) and the decode attention's blocks (decode rows x KV heads x
    segments) are fewer than a wave (multiprocessors x blocks per multiprocessor), so that the
    keys one block sweeps add their time to the step's; else 0. The serial-keys rate fitted
    over all eager steps is held down by short chunks, whose launches hide the attention's GPU
    time; this term adds what the GPU-bound ones pay beyond it. Integers, or int64 arrays."""
    if not isinstance(decodes, np.ndarray):
        if not decodes or tokens <= attention.gpu_bound_tokens:
            return 0
        s = attention.splits(decodes, decode_width // block_size)
        if decodes * attention.kv_heads * s >= attention.multiprocessors * attention.blocks_per_multiprocessor:
            return 0
        return serial_keys(decodes, decode_width, attention, block_size)
    out = np.zeros(decodes.shape, dtype=np.int64)
    for i in np.flatnonzero(decodes * (tokens > attention.gpu_bound_tokens)):
        out[i] = gpu_bound_serial_keys(int(tokens[i]), int(decodes[i]), int(decode_width[i]), attention, block_size)
    return out


def serial_keys(decodes, decode_width, attention: DecodeAttention, block_size: int):
    """Feature :data:`SERIAL_FEATURE` of eager steps: the keys one kernel block sweeps
    (``decode_width / s`` for ``s`` segments) times the waves of ``decodes x kv_heads x s``
    blocks over the multiprocessors (``blocks_per_multiprocessor`` on each at once); 0
    without decodes. Integers, or int64 arrays."""
    if not isinstance(decodes, np.ndarray):
        if not decodes:
            return 0
        s = attention.splits(decodes, decode_width // block_size)
        wave = attention.multiprocessors * attention.blocks_per_multiprocessor
        return -(-(decodes * attention.kv_heads * s) // wave) * (decode_width // s)
    out = np.zeros(decodes.shape, dtype=np.int64)
    for i in np.flatnonzero(decodes):
        out[i] = serial_keys(int(decodes[i]), int(decode_width[i]), attention, block_size)
    return out


def step_features(graph, padded_batch, graph_width, tokens, prefill_seqs, prefill_attention,
                  prefill_context, decode_seqs, decode_width, real_kv=None, serial=None, gpu_bound_serial=None):
    """The features (:data:`FEATURES`, then :data:`SERIAL_FEATURE` when ``serial`` is given,
    then :data:`KV_FEATURE` when ``real_kv`` is) of steps given their summary.

    Arguments are Python integers (one step) or int64 arrays (many); arithmetic only, so
    both give the same numbers. ``graph`` is 1 for a graph step, else 0; ``padded_batch``
    and ``graph_width`` are G and W of a graph step; ``tokens``, ``prefill_seqs``,
    ``prefill_attention``, ``prefill_context``, ``decode_seqs`` and ``decode_width`` (D)
    describe an eager step; ``real_kv`` is :func:`real_kv_tokens` of the decode rows, of
    either kind of step (module docstring); ``serial`` is :func:`serial_keys` of the decode
    rows and ``gpu_bound_serial`` :func:`gpu_bound_serial_keys`, counted for eager steps only.
    """
    gathered = graph * padded_batch * graph_width
    return ((graph, graph * padded_batch,
             *(gathered * ((padded_batch >= lo) * (padded_batch <= hi)) for lo, hi in GRAPH_CLASSES))
            + eager_features(1 - graph, tokens, prefill_seqs, prefill_attention, prefill_context, decode_seqs,
                             decode_width, real_kv, serial, gpu_bound_serial))


GRAPH_TERMS = 2 + len(GRAPH_CLASSES)
"""How many of :func:`step_features` come first and are zero for an eager step."""


def eager_features(eager, tokens, prefill_seqs, prefill_attention, prefill_context, decode_seqs,
                   decode_width, real_kv=None, serial=None, gpu_bound_serial=None):
    """:func:`step_features` from ``eager_step`` on (``eager``: 1 for an eager step, else 0).
    An eager step's first :data:`GRAPH_TERMS` features are zero and add +0.0 to
    :func:`combine`'s sum, so it can be priced from these and the coefficients past them."""
    feats = (eager, eager * tokens, eager * prefill_seqs, eager * prefill_attention,
             eager * prefill_context, eager * decode_seqs, eager * decode_seqs * decode_width,
             # An eager step with decode rows runs the decode-attention path too (gather the
             # rows' blocks, a padded SDPA, per layer): a fixed set of launches, measured on
             # the H200 as +4.6-5.4 ms for 8-128 decodes beside a 512-token chunk at context 1,000.
             eager * (decode_seqs > 0),
             # Below the knee an eager step is bound by launching its kernels, above it by
             # their work (H200: 7.5 / 8.3 / 12.9 / 24.9 / 53.5 ms at 512-8,192 tokens alone):
             # a second, steeper rate per token, which one linear rate cannot give.
             eager * (tokens > EAGER_KNEE_TOKENS) * (tokens - EAGER_KNEE_TOKENS))
    if serial is not None:
        feats = feats + (eager * serial,)
    if gpu_bound_serial is not None:
        feats = feats + (eager * gpu_bound_serial,)
    return feats if real_kv is None else feats + (real_kv,)


KV_STEPS_PER_OCTAVE = 8
"""The real-KV term's resolution: the mean length is rounded up to an 8th of its power of two."""


def real_kv_tokens(decode_seqs, kv_tokens, block_size):
    """The real-KV feature: decode rows times their mean KV length (``kv_tokens`` summed
    over them) rounded up by :func:`kv_quantum`; 0 without decode rows. Integers or int64 arrays."""
    if isinstance(decode_seqs, np.ndarray):
        mean = -(-kv_tokens // np.maximum(decode_seqs, 1))
        # kv_quantum on arrays: 1 << (mean - 1).bit_length() via frexp's exponent.
        octave = np.left_shift(np.int64(1), np.frexp(np.maximum(mean - 1, 0))[1].astype(np.int64))
        return decode_seqs * round_up(mean, np.maximum(octave // KV_STEPS_PER_OCTAVE, block_size))
    if not decode_seqs:
        return 0
    mean = -(-kv_tokens // decode_seqs)
    return decode_seqs * round_up(mean, kv_quantum(mean, block_size))


def kv_quantum(mean: int, block_size: int) -> int:
    """What the mean KV length is rounded up to: an 8th of the power of two at or above it
    (at most 12.5%), at least a block. Coarser than a block so that a run of decode steps,
    whose mean grows by one token a step, keeps one price for many steps: the simulator
    prices a run per constant stretch (speed in benchmarks/README.md)."""
    return max((1 << (mean - 1).bit_length()) // KV_STEPS_PER_OCTAVE, block_size)


def combine(coef, feats):
    """sum(coef[i] * feats[i]) in a fixed order, for scalars and arrays alike (bit-identical)."""
    t = 0.0
    for c, f in zip(coef, feats):
        t = t + c * f
    return t


def round_up(x, block_size):
    """``x`` rounded up to a multiple of ``block_size`` (integers or arrays)."""
    return -(-x // block_size) * block_size


def profile_summaries(columns: dict, block_size: int, graph_sizes: tuple[int, ...]) -> tuple:
    """:func:`step_features` arguments for every row of a step profile (int64 arrays);
    ``real_kv`` only when the table has :data:`KV_COLUMN`."""
    ps, pc, pctx, ds, dctx = (np.asarray(columns[c], dtype=np.int64) for c in COMPOSITION)
    top = dctx + 1
    if graph_sizes:
        padded = np.where(ps == 0, graph_batch_array(ds, graph_sizes), 0)
    else:
        padded = np.zeros_like(ds)
    graph = (padded > 0).astype(np.int64)
    width = np.where(graph == 1, context_blocks_array(top, block_size) * block_size, 0)
    tokens = ps * pc + ds
    attention = ps * (pc * pctx + pc * (pc + 1) // 2)
    dwidth = np.where(ds > 0, round_up(top, block_size), 0)
    summary = (graph, padded, width, tokens, ps, attention, ps * pctx, ds, dwidth)
    if KV_COLUMN not in columns:
        return summary
    kv = np.asarray(columns[KV_COLUMN], dtype=np.int64)
    return summary + (real_kv_tokens(ds, kv, block_size),)


def feature_matrix(columns: dict, block_size: int, graph_sizes: tuple[int, ...],
                   attention: DecodeAttention | None = None) -> np.ndarray:
    """(rows, features) float64 features of a step profile's rows (:func:`features_of`)."""
    n = len(columns[COMPOSITION[0]])
    summary = profile_summaries(columns, block_size, graph_sizes)
    serial = None if attention is None else serial_keys(summary[7], summary[8], attention, block_size)
    bound = None if attention is None or not attention.gpu_bound_tokens else \
        gpu_bound_serial_keys(summary[3], summary[7], summary[8], attention, block_size)
    feats = step_features(*summary[:9], real_kv=summary[9] if len(summary) > 9 else None, serial=serial,
                          gpu_bound_serial=bound)
    return np.column_stack([np.broadcast_to(np.asarray(f, dtype=np.float64), (n,)) for f in feats])


# ----------------------------------------------------------------------------- fitting

@dataclass(frozen=True, eq=False)
class StepFit:
    """Fitted coefficients and their error on held-out rows."""

    coefficients: np.ndarray
    """float64 ms per unit of each feature, in :data:`FEATURES` order (all >= 0)."""
    mape_pct: float
    """Mean absolute percentage error on the held-out rows."""
    max_abs_err_pct: float
    """Largest absolute percentage error on a held-out row."""
    train_mape_pct: float
    """Mean absolute percentage error on the fitted rows."""
    n_train: int
    """Rows fitted."""
    n_heldout: int
    """Rows held out (never seen by the fit)."""
    heldout: np.ndarray
    """bool per table row: held out."""
    split: str = SPLIT_RULE
    """How rows were split."""
    features: tuple[str, ...] = FEATURES
    """Feature names (:func:`features_of` the table fitted)."""
    table_sha256: str = ""
    """:func:`table_digest` of what was fitted: a sidecar fit with the same digest is this fit."""
    target: str = "latency_ms_mean"
    """What was fitted: the forward pass, or with the host time per step (:func:`fit_target`)."""

    @property
    def includes_host(self) -> bool:
        """Whether the fitted time already holds the host time per step."""
        return HOST_COLUMN in self.target

    def to_dict(self) -> dict:
        """The sidecar's ``fit`` entry."""
        return {"features": list(self.features), "table_sha256": self.table_sha256,
                "coefficients_ms": {f: float(c) for f, c in zip(self.features, self.coefficients)},
                "target": self.target, "method": "scipy.optimize.nnls on relative error (rows weighted 1/latency)",
                "mape_pct": self.mape_pct, "max_abs_err_pct": self.max_abs_err_pct,
                "train_mape_pct": self.train_mape_pct, "n_train": self.n_train, "n_heldout": self.n_heldout,
                "split": self.split}


def table_digest(columns: dict, block_size: int, graph_sizes: tuple[int, ...],
                 attention: DecodeAttention | None = None, first_call_ms: float | None = None) -> str:
    """sha256 of everything a fit depends on: the table's columns, the padding settings and
    the feature set (with the decode-attention settings, when there are any). A sidecar fit
    recorded under the same digest need not be redone."""
    settings = (features_of(columns, attention), SPLIT_RULE, int(block_size), tuple(graph_sizes))
    if attention is not None:   # a profile without them hashes as before they existed
        settings += (attention,)   # its repr leaves blocks_per_multiprocessor out: added when not 1
        if attention.blocks_per_multiprocessor != 1:
            settings += (attention.blocks_per_multiprocessor,)
        if attention.gpu_bound_tokens:
            settings += (("gpu_bound_tokens", attention.gpu_bound_tokens),)
    if first_call_ms:
        settings += (("first_call_ms", float(first_call_ms)),)
    h = hashlib.sha256(repr(settings).encode())
    # Host then KV: a table without the KV column hashes as it did before the column existed.
    for c in COLUMNS + tuple(c for c in (HOST_COLUMN, KV_COLUMN) if c in columns) + (
            (FRESH_COLUMN,) if first_call_ms and FRESH_COLUMN in columns else ()):
        h.update(np.ascontiguousarray(columns[c], dtype=np.float64).tobytes())
    return h.hexdigest()


def fit_target(columns: dict, first_call_ms: float | None = None) -> tuple[str, np.ndarray]:
    """What a fit of this table aims at: the forward pass's mean, plus the host time per
    step when the table has :data:`HOST_COLUMN`, less each row's fresh share of
    ``first_call_ms`` when the table has :data:`FRESH_COLUMN` and a first-call cost is given."""
    y = np.asarray(columns["latency_ms_mean"], dtype=np.float64)
    target = "latency_ms_mean"
    if HOST_COLUMN in columns:
        target, y = f"{target} + {HOST_COLUMN}", y + np.asarray(columns[HOST_COLUMN], dtype=np.float64)
    if first_call_ms and FRESH_COLUMN in columns:
        share = np.asarray(columns[FRESH_COLUMN], dtype=np.float64) / np.asarray(columns["n"], dtype=np.float64)
        target, y = f"{target} - {FRESH_COLUMN} / n x {first_call_ms!r} ms", y - share * first_call_ms
        if (y <= 0).any():
            i = int(np.flatnonzero(y <= 0)[0])
            raise InputError(f"row {i}: first_call.ms {first_call_ms:g} is more than the step's measured time "
                             f"allows for its {int(columns[FRESH_COLUMN][i])} fresh samples of {int(columns['n'][i])}: "
                             "the step would cost nothing at a count run before; do not price this first call")
    return target, y


def stored_fit(profile: "StepProfile") -> StepFit | None:
    """The sidecar's fit, if it was made from this very table with today's features
    (it then equals what :func:`fit_step_profile` returns, and spares importing scipy)."""
    rec = profile.meta.get("fit")
    attention = profile.decode_attention
    features = features_of(profile.columns, attention)
    if not isinstance(rec, dict) or rec.get("features") != list(features):
        return None
    digest = table_digest(profile.columns, profile.block_size, profile.cuda_graph_batch_sizes, attention,
                          profile.first_call_ms)
    coefs = rec.get("coefficients_ms")
    if rec.get("table_sha256") != digest or not isinstance(coefs, dict):
        return None
    try:
        coef = np.array([float(coefs[f]) for f in features])
        return StepFit(coefficients=coef, features=features, mape_pct=float(rec["mape_pct"]),
                       max_abs_err_pct=float(rec["max_abs_err_pct"]),
                       train_mape_pct=float(rec["train_mape_pct"]), n_train=int(rec["n_train"]),
                       n_heldout=int(rec["n_heldout"]), heldout=heldout_rows(len(profile)),
                       table_sha256=digest, target=fit_target(profile.columns, profile.first_call_ms)[0])
    except (KeyError, TypeError, ValueError):
        return None


def heldout_rows(n: int) -> np.ndarray:
    """bool mask of the held-out rows of an n-row table (:data:`SPLIT_RULE`)."""
    return np.arange(n) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def fit_step_profile(table, meta: dict | None = None, *, block_size: int | None = None,
                     cuda_graph_batch_sizes: tuple[int, ...] | None = None) -> StepFit:
    """Fit the model to a step profile and report its error on held-out rows.

    ``table``: a :class:`StepProfile`, the path of a step profile CSV, or a mapping of
    columns. ``meta``: sidecar settings to use instead of the profile's own (for a path,
    its sidecar is then not read: the profiler fits before writing it). ``block_size``
    and ``cuda_graph_batch_sizes`` override both; without any, 16 and
    :data:`~schedsim.cost.llm_shapes.CUDA_GRAPH_BATCH_SIZES`.
    """
    # lazy: scipy costs start-up time, and a profile whose sidecar holds its fit never needs it
    from scipy.optimize import nnls

    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        table = load_step_profile(path) if meta is None else StepProfile(read_step_table(path), {}, path)
    elif not isinstance(table, StepProfile):
        table = StepProfile.from_columns(dict(table))
    if meta is not None:
        table = StepProfile(table.columns, validate_sidecar(dict(meta), f"{table.source} (sidecar)"), table.path)
    bs = table.block_size if block_size is None else int(block_size)
    sizes = table.cuda_graph_batch_sizes if cuda_graph_batch_sizes is None else tuple(cuda_graph_batch_sizes)
    n = len(table)
    if n < HELD_OUT_EVERY:
        raise InputError(f"{table.source}: {n} rows are too few to fit and check a step model "
                         f"(need at least {HELD_OUT_EVERY}; one in {HELD_OUT_EVERY} is held out)")
    attention = table.decode_attention
    X = feature_matrix(table.columns, bs, sizes, attention)
    target, y = fit_target(table.columns, table.first_call_ms)
    held = heldout_rows(n)
    train = ~held
    A = X[train] / y[train, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0               # unsupported features stay at 0
    coef, _ = nnls(A / scale, np.ones(int(train.sum())), maxiter=50 * X.shape[1])
    coef = coef / scale
    pred = combine(coef.tolist(), X.T)
    err = np.abs(pred - y) / y * 100.0
    held_err = err[held]
    return StepFit(coefficients=coef, mape_pct=float(held_err.mean()), max_abs_err_pct=float(held_err.max()),
                   train_mape_pct=float(err[train].mean()), n_train=int(train.sum()), n_heldout=int(held.sum()),
                   heldout=held, features=features_of(table.columns, attention),
                   table_sha256=table_digest(table.columns, bs, sizes, attention, table.first_call_ms),
                   target=target)


def save_step_profile(profile: StepProfile, path: str | os.PathLike) -> StepProfile:
    """Fit, then write ``NAME.json`` (the profile's meta with ``schema`` and ``fit``) and ``NAME.csv``.

    Each file is replaced atomically, the CSV last. Returns the profile as it loads from ``path``.
    """
    return write_step_profile(profile, path, fit_step_profile(profile).to_dict())
