"""The step cost model: how long one LLM engine step takes, from a measured step profile.

A step's time depends on its composition: the tokens each row computes
(:attr:`Step.num_tokens <schedsim.core.llm_policy.Step.num_tokens>`) and the context each row
attends over (:attr:`Step.context <schedsim.core.llm_policy.Step.context>`). Rows with more than
one token are prefill chunks, rows with one token are decodes. The model is linear, with
separate terms for the two ways the engine runs a step (:mod:`schedsim.cost.llm_shapes`):

*Graph* steps (decode-only, at most the largest captured batch) replay a CUDA graph at
a padded shape: ``G = graph_batch(n)`` sequences, each gathering a key/value width of
``W = context_blocks(max(context) + 1, block_size) * block_size`` tokens::

    T = g0 + g1 G + g2[class of G] G W

with one per-token rate per class of captured batch size (:data:`GRAPH_CLASSES`): each
captured graph runs its own attention launch shape (split key/value segments at a
batch of 4 or fewer, one CTA per row above), so the cost of a gathered token differs
between them (measured on the H200: fitting one rate for all left 29% errors on
8-sequence decodes over long contexts).

*Eager* steps (any prefill, or more decodes than the largest graph) pad nothing but
their decodes' gathered context to the longest one::

    T = e0 + e1 tokens + e2 n_prefill + e3 sum over prefill chunks of (q c + q (q + 1) / 2)
           + e4 sum over prefill chunks of c
           + e5 n_decode + e6 n_decode D + e7 [n_decode > 0] + e8 max(0, tokens - 1024),
                                               D = ceil((max decode context + 1) / block_size) * block_size

``q c + q (q + 1) / 2`` counts the query-key pairs of a causal chunk of ``q`` tokens over
``c`` cached ones, the note's ``q (c + q / 2)`` made exact in integers. ``n_prefill``
is there because the engine runs attention once per prefill chunk (a fixed cost per
chunk and layer, beside the per-token and per-pair terms), and the sum of prefill
contexts because a chunk over cached tokens first reads (and repeats for grouped-query
attention) its whole context, whatever the chunk's length: a 16-token chunk over 188k
cached tokens takes 44 ms on the H200. ``[n_decode > 0]`` (feature ``eager_decode_step``)
is there because an eager step with any decode rows also runs the decode-attention path
(gather their blocks, a padded SDPA per layer): on the H200 a 512-token chunk took 7.5 ms
alone and 12.2-12.9 ms beside 8-128 decodes, nearly whatever their number.
``max(0, tokens - 1024)`` (``eager_tokens_over_knee``, :data:`EAGER_KNEE_TOKENS`) gives
the tokens a second, steeper rate where the step's work outgrows its launches: alone, a
chunk of 512 / 1,024 / 2,048 / 4,096 / 8,192 tokens took 7.5 / 8.3 / 12.9 / 24.9 / 53.5 ms
on the H200 (held-out error 6.5% without the term, 5.7% with it).

*Serial keys* (only for a profile whose sidecar has :data:`ATTENTION_KEY`): one more eager
term, ``+ e9 S``, where ``S`` (:func:`serial_keys`) counts the keys one kernel block of the
decode attention sweeps, times the waves of blocks over the GPU's multiprocessors. The
memory-efficient kernel an eager step uses runs a block per (decode row, KV head) over the
row's whole padded width, unless the width splits into segments; with fewer blocks than
multiprocessors its time follows ``S``, not the keys in all. On the H200 one decode at
32,000 tokens beside an 8,192-token chunk added 30 ms, at 32,767 tokens (which splits) 3 ms
(experiments/llm_profile/few-decodes/).

*First calls* (only for a profile whose sidecar's :data:`FIRST_CALL_KEY` says ``"priced":
true``; the profiler measures it and writes false, see below): the first
time the engine runs an eager step of a given token count (the GEMMs' M), it costs more
(the GEMM kernels are chosen for the new shape on the host): on the H200 3.3 ms at the
median for a step of 140-2,000 tokens at a new count, 0.05 ms at a count run before, per
exact count (experiments/fidelity-llm/diagnose_first_call_distance.py). The profiler
measures it (``first_call.ms``: new counts timed twice, the first call less the second);
its samples of steps with a prefill move their token count to new ones (``fresh_samples``
of the ``n``, :data:`FRESH_COLUMN`), so the fit aims at each row's mean less its fresh
share of ``first_call.ms``: the price of a count run before. A simulation then adds
``first_call.ms`` to an eager step with a prefill whose token count it has not priced yet
in this run, beyond :attr:`StepCostModel.warm_tokens` (what the engine ran before the run:
the live runner's warm-up, :func:`schedsim.live.llm_driver.warm_token_counts`). A long run meets
every count sooner or later and stops paying; a short one at light load pays at nearly
every prefill. Not priced by default: against four live runs of the LLM fidelity table it
moved the median error from 5.8% to 5.2% with one profile and from 7.9% to 9.3% with
another, measured on a faster host (experiments/llm_profile/first-calls/).

*Real KV tokens* (only for a profile with the :data:`KV_COLUMN` column, which says how
many tokens the decode rows really hold when their contexts differ): one more term, for
graph and eager steps alike::

    + k n_decode m,    m = ceil(sum over decode rows of (context + 1) / n_decode), rounded up

The engine gathers each decode row's blocks into a buffer padded to the longest row with
the null block: the gather *reads* each row's own blocks (the null block's many entries
read one cached block), while the padded buffer is written and attention reads all of
it. So a batch that mixes short and long contexts costs less than the padded width
(``W`` or ``D``) says: the padded terms price the writes and the attention, this one the
real reads. Measured decode compositions with mixed contexts separate the two. The mean
length is rounded up (to an 8th of its power of two, :func:`_kv_quantum`), not each
row's, so that in a run of decode steps the term changes once in many steps (:meth:`StepCostModel.decode_run_segments`
prices each constant stretch once). A profile without the column is fitted with the
features above alone, exactly as before it existed.

The coefficients
(:data:`FEATURES`, ms per unit) are fitted by non-negative least squares
on relative error (each row weighted by 1 / its latency) to the profile's mean
latencies. :func:`step_features` computes the features from a step's summary with
arithmetic alone, so the same function builds the fitting matrix, prices one step on
Python integers (:meth:`StepCostModel.step_ns`) and prices runs of decode steps on
arrays (:meth:`StepCostModel.decode_run_ns`).

Beyond the measured context (:attr:`StepProfile.max_context_measured`) the model
extends along context length with the same linear attention terms: decode cost grows
with the key/value tokens gathered, prefill cost with the query-key pairs, at the
fitted per-token rates. That is what memory-bound decode attention and compute-bound
prefill attention do, but it is not measured; the model warns once
(:class:`ContextExtrapolationWarning`) or, with ``extrapolate_context=False``, refuses.

Step profile files (``NAME.csv`` and the sidecar ``NAME.json``; reference:
docs/reference/llm-profile-format.md). The CSV has one row per measured step
composition, in the order measured:

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
    every row has the longest context). With it the model has the real-KV term above.

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
:mod:`schedsim.live.loop_overhead`) and ``fit`` (:meth:`StepFit.to_dict`: a record; the model refits the table
on load with the same function and split, so the table is the one source of truth).
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schedsim.errors import InputError, where
from schedsim.files import replaced_atomically
from schedsim.cost.llm_shapes import (CUDA_GRAPH_BATCH_SIZES, context_blocks, context_blocks_array,
                                 graph_batch, graph_batch_array)
from schedsim.core.llm_policy import SMALL, int_max

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
ATTENTION_FIELDS = ("kv_heads", "split_ctas", "min_split_blocks", "multiprocessors", "blocks_per_multiprocessor",
                    "gpu_bound_tokens")
"""The sidecar's :data:`ATTENTION_KEY` object: integers >= 1, the last two optional."""
ATTENTION_REQUIRED = ATTENTION_FIELDS[:4]
GPU_BOUND_SERIAL_FEATURE = "eager_gpu_bound_idle_serial_keys"
"""The feature a profile whose :data:`ATTENTION_KEY` has ``gpu_bound_tokens`` adds, after
:data:`SERIAL_FEATURE`: :func:`gpu_bound_serial_keys`."""
ATTENTION_KEY = "decode_attention"
"""Sidecar object: how the engine launches an eager step's decode attention
(:class:`DecodeAttention`), which :func:`serial_keys` needs."""

HELD_OUT_EVERY = 5
SPLIT_RULE = "rows in file order; row i (0-based) held out when i % 5 == 4, the rest fitted"
DEFAULT_BLOCK_SIZE = 16


class ContextExtrapolationWarning(UserWarning):
    """A step attended over more context than the profile measured; its cost is extrapolated."""


# ----------------------------------------------------------------------------- features

def features_of(columns, attention: "DecodeAttention | None" = None) -> tuple[str, ...]:
    """The features a profile supports: :data:`FEATURES`, then :data:`SERIAL_FEATURE` when
    its sidecar describes the decode attention (and :data:`GPU_BOUND_SERIAL_FEATURE` when
    that gives ``gpu_bound_tokens``), then :data:`KV_FEATURE` when the table has
    :data:`KV_COLUMN`."""
    serial = (SERIAL_FEATURE,) if attention is not None else ()
    if attention is not None and attention.gpu_bound_tokens:
        serial += (GPU_BOUND_SERIAL_FEATURE,)
    return FEATURES + serial + ((KV_FEATURE,) if KV_COLUMN in columns else ())


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
    error up (experiments/fidelity-llm/README.md, session 7), so the profiler leaves it out."""
    gpu_bound_tokens: int = field(default=0, repr=False)   # out of repr: table_digest
    """Eager steps of more tokens than this are bound by their GPU work, not their launches:
    their decode attention, when its blocks leave multiprocessors idle, adds its serial keys'
    time on top (feature :data:`GPU_BOUND_SERIAL_FEATURE`, :func:`gpu_bound_serial_keys`).
    Optional in the sidecar; 0 (absent) leaves the feature out. On the H200 a chunk alone took
    7.5 ms at 512 tokens, 8.3 at 1,024, 12.9 at 2,048 and 53 at 8,192: the launches bind up to
    about 1,024 tokens and the work from 2,048 (experiments/fidelity-llm/README.md, session 10)."""

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
    eager = 1 - graph
    gathered = graph * padded_batch * graph_width
    feats = (graph, graph * padded_batch,
             *(gathered * ((padded_batch >= lo) * (padded_batch <= hi)) for lo, hi in GRAPH_CLASSES),
             eager, eager * tokens, eager * prefill_seqs, eager * prefill_attention,
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
    over them) rounded up by :func:`_kv_quantum`; 0 without decode rows. Integers or int64 arrays."""
    if isinstance(decode_seqs, np.ndarray):
        mean = -(-kv_tokens // np.maximum(decode_seqs, 1))
        # _kv_quantum on arrays: 1 << (mean - 1).bit_length() via frexp's exponent.
        octave = np.left_shift(np.int64(1), np.frexp(np.maximum(mean - 1, 0))[1].astype(np.int64))
        return decode_seqs * _round_up(mean, np.maximum(octave // KV_STEPS_PER_OCTAVE, block_size))
    if not decode_seqs:
        return 0
    mean = -(-kv_tokens // decode_seqs)
    return decode_seqs * _round_up(mean, _kv_quantum(mean, block_size))


def _kv_quantum(mean: int, block_size: int) -> int:
    """What the mean KV length is rounded up to: an 8th of the power of two at or above it
    (at most 12.5%), at least a block. Coarser than a block so that a run of decode steps,
    whose mean grows by one token a step, keeps one price for many steps: the simulator
    prices a run per constant stretch (speed in benchmarks/README.md)."""
    return max((1 << (mean - 1).bit_length()) // KV_STEPS_PER_OCTAVE, block_size)


def _combine(coef, feats):
    """sum(coef[i] * feats[i]) in a fixed order, for scalars and arrays alike (bit-identical)."""
    t = 0.0
    for c, f in zip(coef, feats):
        t = t + c * f
    return t


def _round_up(x, block_size):
    return -(-x // block_size) * block_size


def _summary_of_lists(num_tokens: list, context: list) -> tuple:
    """(tokens, decodes, longest decode context + 1 or 0, longest prefill context + chunk,
    prefill query-key pairs, prefill contexts summed, decode contexts + 1 summed) of a
    step's rows, in Python ints (a short step)."""
    tokens = nd = dmax = top = attention = pctx = kv = 0
    for q, c in zip(num_tokens, context):
        tokens += q
        if q == 1:
            nd += 1
            kv += c
            if c >= dmax:
                dmax = c + 1
        else:
            attention += q * c + q * (q + 1) // 2
            pctx += c
            if q + c > top:
                top = q + c
    return tokens, nd, dmax, top, attention, pctx, kv + nd


def _summary_of_arrays(num_tokens: np.ndarray, context: np.ndarray) -> tuple:
    """:func:`_summary_of_lists` of a long step, on arrays; exact integers too."""
    decode = num_tokens == 1
    nd = int(np.count_nonzero(decode))
    dmax = int(context.max(where=decode, initial=-1)) + 1
    kv = int(context.sum(where=decode, dtype=np.int64)) + nd
    top = attention = pctx = 0
    if nd < num_tokens.shape[0]:
        # Python ints over the (few) prefill chunks: exact, and cheaper than numpy on short lists.
        pre = np.flatnonzero(~decode)
        for q, c in zip(num_tokens[pre].tolist(), context[pre].tolist()):
            attention += q * c + q * (q + 1) // 2
            pctx += c
            top = max(top, q + c)
    return int(num_tokens.sum()), nd, dmax, top, attention, pctx, kv


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
    dwidth = np.where(ds > 0, _round_up(top, block_size), 0)
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


# ----------------------------------------------------------------------------- the profile

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
        without it, and then the model has no :data:`SERIAL_FEATURE`."""
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
        return cls(cols, _validate_meta(dict(meta or {}), src + " (sidecar)"), None if path is None else Path(path))


def sidecar_path(csv_path) -> Path:
    return Path(csv_path).with_suffix(".json")


def load_step_profile(path: str | os.PathLike) -> StepProfile:
    """Read and validate ``NAME.csv`` and its sidecar ``NAME.json`` (optional)."""
    path = Path(path)
    cols = _read_table(path)
    meta: dict = {}
    side = sidecar_path(path)
    if side.is_file():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{side}: cannot read sidecar: {e}") from None
        except json.JSONDecodeError as e:
            raise InputError(f"{where(side, e.lineno)}: invalid JSON: {e.msg} (column {e.colno})") from None
        meta = _validate_meta(meta, str(side))
    return StepProfile(cols, meta, path)


def _read_table(path: Path) -> dict:
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


def _validate_meta(meta, src: str) -> dict:
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


def save_step_profile(profile: StepProfile, path: str | os.PathLike) -> StepProfile:
    """Fit, then write ``NAME.json`` (the profile's meta with ``schema`` and ``fit``) and ``NAME.csv``.

    Each file is replaced atomically, the CSV last. Returns the profile as it loads from ``path``.
    """
    path = Path(path)
    meta = dict(profile.meta)
    meta["schema"] = SCHEMA
    meta["fit"] = fit_step_profile(profile).to_dict()
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
    import hashlib

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
    from scipy.optimize import nnls

    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        table = load_step_profile(path) if meta is None else StepProfile(_read_table(path), {}, path)
    elif not isinstance(table, StepProfile):
        table = StepProfile.from_columns(dict(table))
    if meta is not None:
        table = StepProfile(table.columns, _validate_meta(dict(meta), f"{table.source} (sidecar)"), table.path)
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
    pred = _combine(coef.tolist(), X.T)
    err = np.abs(pred - y) / y * 100.0
    held_err = err[held]
    return StepFit(coefficients=coef, mape_pct=float(held_err.mean()), max_abs_err_pct=float(held_err.max()),
                   train_mape_pct=float(err[train].mean()), n_train=int(train.sum()), n_heldout=int(held.sum()),
                   heldout=held, features=features_of(table.columns, attention),
                   table_sha256=table_digest(table.columns, bs, sizes, attention, table.first_call_ms),
                   target=target)


# ----------------------------------------------------------------------------- the model

class StepCostModel:
    """Duration of one engine step, in integer nanoseconds, from a fitted step profile.

    What it includes: the fitted forward-pass time of the step's composition (module
    docstring), the profile's ``step_overhead_us`` (host time per step outside the forward
    pass), the serving loop's host time between engine calls (``loop_overhead_us +
    loop_overhead_us_per_row * rows``; ``loop_overhead_us`` here replaces the profile's
    pair), and for swap preemption the copy of ``swap_blocks`` KV blocks at
    ``swap_gb_per_s``: ``swap_blocks * bytes_per_block / (swap_gb_per_s * 1e9)`` seconds.
    ``bytes_per_block`` comes from the model spec's block budget
    (:attr:`~schedsim.cost.llm_spec.BlockBudget.bytes_per_block`); pass it here or set the
    attribute before the first swap. What it does not include: run-to-run spread (it
    returns the fitted mean), sampling and detokenisation beyond what the profile's
    steps timed, and any interaction between consecutive steps.
    """

    def __init__(self, profile: StepProfile, fit: StepFit, *, extrapolate_context: bool = True,
                 bytes_per_block: int | None = None, swap_gb_per_s: float | None = None,
                 loop_overhead_us: tuple[float, float] | None = None):
        """Prefer :meth:`from_profile`."""
        self.profile = profile
        self.fit = fit
        self.block_size = profile.block_size
        self.graph_sizes = profile.cuda_graph_batch_sizes
        self.max_context_measured = profile.max_context_measured
        self.extrapolate_context = bool(extrapolate_context)
        self.bytes_per_block = bytes_per_block
        """Bytes of one KV block, for swap costs; None until known."""
        if swap_gb_per_s is None:
            swap_gb_per_s = profile.meta.get("swap_gb_per_s")
        if swap_gb_per_s is not None and not (isinstance(swap_gb_per_s, (int, float)) and swap_gb_per_s > 0):
            raise InputError(f"swap_gb_per_s: {swap_gb_per_s!r} must be a number > 0 (GB/s)")
        self.swap_gb_per_s = swap_gb_per_s
        # A fit of forward pass plus host time per composition holds the overhead already.
        self.overhead_ns = 0.0 if fit.includes_host else float(profile.meta.get("step_overhead_us") or 0.0) * 1e3
        # The serving loop between engine calls (the policy, block tables, token hand-back):
        # outside what the profile timed, so added whatever the fit includes.
        if loop_overhead_us is None:
            loop_overhead_us = tuple(float(profile.meta.get(k) or 0.0) for k in LOOP_KEYS)
        a, b = loop_overhead_us
        if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0):
            raise InputError(f"loop overhead: {a!r} us + {b!r} us per row must be numbers >= 0")
        self.loop_ns = (a * 1e3, b * 1e3)
        """(ns per step, ns per row of the step): the serving loop's host time, added to every step."""
        self.extrapolated = False
        """Whether any step so far attended beyond :attr:`max_context_measured` (warned once)."""
        coef = [float(c) for c in fit.coefficients]
        # The real-KV term, where the fit has it and gave it a weight; a zero weight adds
        # nothing, and leaving it out keeps decode runs one price per padded width.
        self._real_kv = fit.features[-1] == KV_FEATURE and coef[-1] != 0.0
        if fit.features[-1] == KV_FEATURE and not self._real_kv:
            coef.pop()
        self._coef = coef
        fc = profile.first_call_ms
        self.first_call_ns = 0.0 if fc is None else fc * 1e6
        """ns an eager step with a prefill costs more at a token count this run has not priced yet."""
        self.warm_tokens: frozenset = frozenset()
        """Token counts the engine has run before a run starts (the live warm-up's): no first-call cost."""
        self.seen_tokens: set = set()
        """Token counts priced so far in this run, :attr:`warm_tokens` included (:meth:`begin_run`)."""
        # The eager decode attention's serial keys, where the fit has the feature.
        self._attention = profile.decode_attention if SERIAL_FEATURE in fit.features else None
        self._gpu_bound = GPU_BOUND_SERIAL_FEATURE in fit.features
        self._decode_memo: dict[tuple[int, int], float] = {}

    @classmethod
    def from_profile(cls, profile: StepProfile, *, extrapolate_context: bool = True,
                     bytes_per_block: int | None = None, swap_gb_per_s: float | None = None,
                     loop_overhead_us: tuple[float, float] | None = None) -> "StepCostModel":
        """Fit ``profile`` (:func:`fit_step_profile`) and build the model; a sidecar fit of
        the same table and features (:func:`stored_fit`) is taken as it is.

        ``extrapolate_context``: price contexts beyond the measured ones with the linear
        attention terms and warn once (True), or raise InputError (False).
        ``swap_gb_per_s``: None takes the sidecar's (needed only for swap preemption).
        ``loop_overhead_us``: (µs per step, µs per row); None takes the sidecar's (or none).
        """
        fit = stored_fit(profile) or fit_step_profile(profile)
        return cls(profile, fit, extrapolate_context=extrapolate_context,
                   bytes_per_block=bytes_per_block, swap_gb_per_s=swap_gb_per_s,
                   loop_overhead_us=loop_overhead_us)

    def begin_run(self) -> None:
        """Start pricing a run: the engine has run :attr:`warm_tokens` and nothing else
        (:func:`~schedsim.core.llm_simulate.simulate_llm` calls this; the same inputs then give the
        same prices, however often the model is reused)."""
        self.seen_tokens = set(self.warm_tokens)

    def __repr__(self) -> str:
        return (f"StepCostModel({self.profile.source!r}, held-out MAPE {self.fit.mape_pct:.2f}%, "
                f"max context measured {self.max_context_measured})")

    def step_ns(self, num_tokens: np.ndarray, context: np.ndarray, swap_blocks: int = 0) -> int:
        """Duration of one step whose rows compute ``num_tokens`` tokens each over ``context`` cached ones."""
        n = num_tokens.shape[0]
        if n == 0:
            raise ValueError("step_ns: a step needs at least one row")
        if n < SMALL:
            tokens, nd, dmax, top, attention, pctx, kv = _summary_of_lists(num_tokens.tolist(), context.tolist())
        else:
            tokens, nd, dmax, top, attention, pctx, kv = _summary_of_arrays(num_tokens, context)
        bs = self.block_size
        real = real_kv_tokens(nd, kv, bs) if self._real_kv else 0
        if nd == n:   # decode-only
            if dmax > self.max_context_measured:
                self._beyond(dmax)
            x = self._decode_x(n, self._decode_width(n, dmax), real)
        else:
            dwidth = _round_up(dmax, bs) if nd else 0
            top = max(top, dmax)
            if top > self.max_context_measured:
                self._beyond(top)
            s = (0, 0, 0, tokens, n - nd, attention, pctx, nd, dwidth)
            serial = serial_keys(nd, dwidth, self._attention, bs) if self._attention else None
            bound = gpu_bound_serial_keys(tokens, nd, dwidth, self._attention, bs) if self._gpu_bound else None
            feats = step_features(*s, real_kv=real if self._real_kv else None, serial=serial, gpu_bound_serial=bound)
            x = _combine(self._coef, feats) * 1e6 + self.overhead_ns + self._loop(n)
            if self.first_call_ns and tokens not in self.seen_tokens:   # (this branch has a prefill)
                x += self.first_call_ns   # the engine's first step of this token count
                self.seen_tokens.add(tokens)
        if swap_blocks:
            x += self._swap_ns(swap_blocks)
        return round(x)

    def decode_run_ns(self, context: np.ndarray, k: int) -> np.ndarray:
        """int64 durations of ``k`` back-to-back decode-only steps of the same rows, contexts
        growing by one per step: ``[step_ns(ones, context + j) for j in range(k)]``, bit for bit."""
        if k <= 0:
            if context.shape[0] == 0:
                raise ValueError("decode_run_ns: a step needs at least one row")
            return np.empty(0, dtype=np.int64)
        counts, prices = self.decode_run_segments(context, k)
        if len(prices) == 1:
            return np.full(k, prices[0], dtype=np.int64)
        return np.repeat(np.array(prices, dtype=np.int64), counts)

    def decode_run_segments(self, context: np.ndarray, k: int) -> tuple[list[int], list[int]]:
        """:meth:`decode_run_ns` run-length encoded: ``(counts, prices)``, ``k >= 1`` steps in
        all. A driver that needs only where the run stops skips building the array (mostly
        one price: the padded width changes once in many steps)."""
        n = context.shape[0]
        if n == 0:
            raise ValueError("decode_run_ns: a step needs at least one row")
        if not self._real_kv:
            return self._width_segments(n, int_max(context) + 1, k)
        if n < SMALL:
            values = context.tolist()
            top, kv = max(values) + 1, sum(values) + n
        else:
            top, kv = int(context.max()) + 1, int(context.sum()) + n   # int32 sums in int64
        if top + k - 1 > self.max_context_measured:
            self._beyond(top + k - 1)
        # As _width_segments, and the real-KV term changes where the rows' mean length
        # (up by one a step) crosses its rounding (_kv_quantum).
        counts, prices = [], []
        end = top + k
        bs = self.block_size
        mean = -(-kv // n)
        rounded = _round_up(mean, _kv_quantum(mean, bs))
        width = self._decode_width(n, top)
        while True:
            stop = min(width + 1, end, top + rounded - mean + 1)
            counts.append(stop - top)
            prices.append(round(self._decode_x(n, width, n * rounded)))
            if stop == end:
                return counts, prices
            mean += stop - top
            top = stop
            if mean > rounded:
                rounded = _round_up(mean, _kv_quantum(mean, bs))
            if top > width:
                width = self._decode_width(n, top)

    def _width_segments(self, n: int, top: int, k: int) -> tuple[list[int], list[int]]:
        """:meth:`decode_run_segments` without the real-KV term: one price per padded width."""
        if top + k - 1 > self.max_context_measured:
            self._beyond(top + k - 1)
        # The price changes only where the padded width does (every block, or at powers of
        # two for a graph): price each width once, as step_ns does, and repeat it.
        counts, prices = [], []
        end = top + k
        while top < end:
            width = self._decode_width(n, top)
            stop = min(width + 1, end)   # the steps whose longest context + 1 is at most width
            counts.append(stop - top)
            prices.append(round(self._decode_x(n, width, 0)))
            top = stop
        return counts, prices

    def _decode_width(self, n: int, top: int) -> int:
        """Key/value width a decode-only step of ``n`` rows gathers when its longest row
        attends over ``top`` tokens (its context + 1): W of a graph step, D of an eager one."""
        if self.graph_sizes and graph_batch(n, self.graph_sizes):
            return context_blocks(top, self.block_size) * self.block_size
        return _round_up(top, self.block_size)

    def _decode_x(self, n: int, width: int, real: int) -> float:
        """Unrounded ns of a decode-only step of ``n`` rows gathering ``width`` tokens, ``real``
        of them the rows' own (:func:`real_kv_tokens`; 0 without the term)."""
        t = self._decode_memo.get((n, width))
        if t is None:
            t = self._decode_ms_padded(n, width)
        if self._real_kv:   # the last term of _combine's sum, added last as there: the same float
            t = t + self._coef[-1] * real
        return t * 1e6 + self.overhead_ns + self._loop(n)

    def _loop(self, rows: int) -> float:
        """ns of the serving loop's host time around a step of ``rows`` rows (0.0 without it)."""
        a, b = self.loop_ns
        return a + b * rows

    def _decode_ms_padded(self, n: int, width: int) -> float:
        """ms of a decode-only step before the real-KV term: :func:`_combine` of every other
        feature. Memoised: a run prices the same few shapes over and over."""
        if len(self._decode_memo) >= 1 << 16:   # eager steps over ever longer contexts
            self._decode_memo.clear()
        padded = graph_batch(n, self.graph_sizes) if self.graph_sizes else 0
        if padded:   # a graph step: no serial keys (the zip in _combine leaves their weight out)
            feats = step_features(1, padded, width, 0, 0, 0, 0, 0, 0)
        else:
            serial = serial_keys(n, width, self._attention, self.block_size) if self._attention else None
            bound = gpu_bound_serial_keys(n, n, width, self._attention, self.block_size) if self._gpu_bound else None
            feats = step_features(0, 0, 0, n, 0, 0, 0, n, width, serial=serial, gpu_bound_serial=bound)
        t = self._decode_memo[(n, width)] = _combine(self._coef, feats)
        return t

    def _swap_ns(self, blocks: int) -> float:
        if self.swap_gb_per_s is None:
            raise InputError(f"swap preemption needs the host<->device copy bandwidth: {self.profile.source}'s "
                             "sidecar has no swap_gb_per_s; measure it or pass --swap-gb-per-s")
        if self.bytes_per_block is None:
            raise ValueError("StepCostModel.bytes_per_block must be set before pricing a swap")
        return blocks * self.bytes_per_block / self.swap_gb_per_s  # bytes / (GB/s) = ns

    def _beyond(self, top: int) -> None:
        if not self.extrapolate_context:
            raise InputError(f"step profile {self.profile.source} measured contexts up to "
                             f"{self.max_context_measured} tokens, but a step attends over {top}; "
                             "measure longer contexts or allow extrapolation")
        if not self.extrapolated:
            self.extrapolated = True
            warnings.warn(f"step profile {self.profile.source} measured contexts up to {self.max_context_measured} "
                          f"tokens; a step attends over {top}: its attention cost is extrapolated linearly "
                          "(reported once)", ContextExtrapolationWarning, stacklevel=3)
