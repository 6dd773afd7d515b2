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

with one per-token rate per class of captured batch size (:data:`~schedsim.cost.step_fit.GRAPH_CLASSES`): each
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
``max(0, tokens - 1024)`` (``eager_tokens_over_knee``, :data:`~schedsim.cost.step_fit.EAGER_KNEE_TOKENS`) gives
the tokens a second, steeper rate where the step's work outgrows its launches: alone, a
chunk of 512 / 1,024 / 2,048 / 4,096 / 8,192 tokens took 7.5 / 8.3 / 12.9 / 24.9 / 53.5 ms
on the H200 (held-out error 6.5% without the term, 5.7% with it).

*Serial keys* (only for a profile whose sidecar has :data:`~schedsim.cost.step_profile.ATTENTION_KEY`): one more eager
term, ``+ e9 S``, where ``S`` (:func:`~schedsim.cost.step_fit.serial_keys`) counts the keys one kernel block of the
decode attention sweeps, times the waves of blocks over the GPU's multiprocessors. The
memory-efficient kernel an eager step uses runs a block per (decode row, KV head) over the
row's whole padded width, unless the width splits into segments; with fewer blocks than
multiprocessors its time follows ``S``, not the keys in all. On the H200 one decode at
32,000 tokens beside an 8,192-token chunk added 30 ms, at 32,767 tokens (which splits) 3 ms
(experiments/llm_profile/few-decodes/).

*First calls* (only for a profile whose sidecar's :data:`~schedsim.cost.step_profile.FIRST_CALL_KEY` says ``"priced":
true``; the profiler measures it and writes false, see below): the first
time the engine runs an eager step of a given token count (the GEMMs' M), it costs more
(the GEMM kernels are chosen for the new shape on the host): on the H200 3.3 ms at the
median for a step of 140-2,000 tokens at a new count, 0.05 ms at a count run before, per
exact count (experiments/fidelity-llm/diagnose_first_call_distance.py). The profiler
measures it (``first_call.ms``: new counts timed twice, the first call less the second);
its samples of steps with a prefill move their token count to new ones (``fresh_samples``
of the ``n``, :data:`~schedsim.cost.step_profile.FRESH_COLUMN`), so the fit aims at each row's mean less its fresh
share of ``first_call.ms``: the price of a count run before. A simulation then adds
``first_call.ms`` to an eager step with a prefill whose token count it has not priced yet
in this run, beyond :attr:`StepCostModel.warm_tokens` (what the engine ran before the run:
the live runner's warm-up, :func:`schedsim.live.llm_warmup.warm_token_counts`). A long run meets
every count sooner or later and stops paying; a short one at light load pays at nearly
every prefill. Not priced by default: against four live runs of the LLM fidelity table it
moved the median error from 5.8% to 5.2% with one profile and from 7.9% to 9.3% with
another, measured on a faster host (experiments/llm_profile/first-calls/).

*Real KV tokens* (only for a profile with the :data:`~schedsim.cost.step_profile.KV_COLUMN` column, which says how
many tokens the decode rows really hold when their contexts differ): one more term, for
graph and eager steps alike::

    + k n_decode m,    m = ceil(sum over decode rows of (context + 1) / n_decode), rounded up

The engine gathers each decode row's blocks into a buffer padded to the longest row with
the null block: the gather *reads* each row's own blocks (the null block's many entries
read one cached block), while the padded buffer is written and attention reads all of
it. So a batch that mixes short and long contexts costs less than the padded width
(``W`` or ``D``) says: the padded terms price the writes and the attention, this one the
real reads. Measured decode compositions with mixed contexts separate the two. The mean
length is rounded up (to an 8th of its power of two, :func:`~schedsim.cost.step_fit.kv_quantum`), not each
row's, so that in a run of decode steps the term changes once in many steps (:meth:`StepCostModel.decode_run_segments`
prices each constant stretch once). A profile without the column is fitted with the
features above alone, exactly as before it existed.

Beyond the measured context (:attr:`~schedsim.cost.step_profile.StepProfile.max_context_measured`) the model
extends along context length with the same linear attention terms: decode cost grows
with the key/value tokens gathered, prefill cost with the query-key pairs, at the
fitted per-token rates. That is what memory-bound decode attention and compute-bound
prefill attention do, but it is not measured; the model warns once
(:class:`ContextExtrapolationWarning`) or, with ``extrapolate_context=False``, refuses.

The coefficients are fitted by :mod:`schedsim.cost.step_fit` to a step profile
(:mod:`schedsim.cost.step_profile`).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from schedsim.core.llm_policy import SMALL, int_max
from schedsim.cost.llm_shapes import context_blocks, graph_batch
from schedsim.cost.step_fit import (GPU_BOUND_SERIAL_FEATURE, GRAPH_TERMS, KV_FEATURE, SERIAL_FEATURE, StepFit,
                                    combine, eager_features, fit_step_profile, gpu_bound_serial_keys, kv_quantum,
                                    real_kv_tokens, round_up, serial_keys, step_features, stored_fit)
from schedsim.cost.step_profile import LOOP_KEYS, StepProfile, load_step_profile
from schedsim.errors import InputError


class ContextExtrapolationWarning(UserWarning):
    """A step attended over more context than the profile measured; its cost is extrapolated."""


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
    """:func:`_summary_of_lists` of a long step, on arrays; exact integers too. Few numpy
    calls (each costs about a microsecond whatever its size): the sums over all rows, less
    the (few) prefill chunks' share, worked out in Python ints."""
    n = num_tokens.shape[0]
    pre = (num_tokens != 1).nonzero()[0]   # (np.flatnonzero's Python wrapper costs as much again)
    contexts = int(_add(context, dtype=np.int64))
    if not pre.shape[0]:   # decode-only
        return n, n, int(_maximum(context)) + 1, 0, 0, 0, contexts + n
    tokens = top = attention = pctx = 0
    for q, c in zip(num_tokens[pre].tolist(), context[pre].tolist()):
        tokens += q
        attention += q * c + q * (q + 1) // 2
        pctx += c
        if q + c > top:
            top = q + c
    nd = n - pre.shape[0]
    dmax = int(_maximum(context, where=num_tokens == 1, initial=-1)) + 1 if nd else 0
    return tokens + nd, nd, dmax, top, attention, pctx, contexts - pctx + nd


_add, _maximum = np.add.reduce, np.maximum.reduce
"""The reductions without ndarray.sum/max's Python-level wrappers."""


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
        # An eager step's price starts past the graph features (zero for it), where their
        # weights are finite (a zero feature then adds +0.0; an infinite weight would add NaN).
        self._eager_coef = coef[GRAPH_TERMS:] if all(map(math.isfinite, coef[:GRAPH_TERMS])) else None
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
            dwidth = round_up(dmax, bs) if nd else 0
            top = max(top, dmax)
            if top > self.max_context_measured:
                self._beyond(top)
            s = (tokens, n - nd, attention, pctx, nd, dwidth, real if self._real_kv else None,
                 serial_keys(nd, dwidth, self._attention, bs) if self._attention else None,
                 gpu_bound_serial_keys(tokens, nd, dwidth, self._attention, bs) if self._gpu_bound else None)
            if self._eager_coef is None:
                x = combine(self._coef, step_features(0, 0, 0, *s))
            else:   # the same sum: the graph features it skips are zeros, adding +0.0
                x = combine(self._eager_coef, eager_features(1, *s))
            x = x * 1e6 + self.overhead_ns + self._loop(n)
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
        # (up by one a step) crosses its rounding (kv_quantum).
        counts, prices = [], []
        end = top + k
        bs = self.block_size
        mean = -(-kv // n)
        rounded = round_up(mean, kv_quantum(mean, bs))
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
                rounded = round_up(mean, kv_quantum(mean, bs))
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
        return round_up(top, self.block_size)

    def _decode_x(self, n: int, width: int, real: int) -> float:
        """Unrounded ns of a decode-only step of ``n`` rows gathering ``width`` tokens, ``real``
        of them the rows' own (:func:`real_kv_tokens`; 0 without the term)."""
        t = self._decode_memo.get((n, width))
        if t is None:
            t = self._decode_ms_padded(n, width)
        if self._real_kv:   # the last term of combine's sum, added last as there: the same float
            t = t + self._coef[-1] * real
        return t * 1e6 + self.overhead_ns + self._loop(n)

    draft = None
    """The draft model's :class:`StepCostModel` (speculative decoding), or None."""
    draft_fraction = 0.1
    """Without :attr:`draft`: a draft token costs this share of a decode step of the same rows."""

    def price_drafts(self, spec) -> str | None:
        """Price the drafts of ``spec`` (a :class:`~schedsim.core.llm_policy.SpeculativeConfig`,
        or None): from its ``draft_profile``, or as a share of a target decode step; returns
        the note a run prints when that share is a default rather than a measurement."""
        if spec is None:
            return None
        if spec.draft_profile:
            if not Path(spec.draft_profile).exists():
                raise InputError(f"--speculative-config: draft_profile {spec.draft_profile}: no such step profile")
            self.draft = StepCostModel.from_profile(load_step_profile(spec.draft_profile))
            return None
        self.draft_fraction = spec.draft_fraction
        if spec.draft_cost_fraction is not None:
            return None
        return (f"speculative decoding ({spec.method}, {spec.num_speculative_tokens} draft tokens): no "
                f"draft_profile given, so each draft token is priced at {spec.draft_fraction:g} of a "
                f"target decode step of the same rows (the method's default); give draft_profile or "
                f"draft_cost_fraction in --speculative-config to set it")

    def draft_ns(self, context: np.ndarray, k: int) -> int:
        """ns to draft ``k`` tokens for rows over ``context`` tokens: ``k`` decode steps of the
        draft model (:attr:`draft`), or ``k x draft_fraction`` of this model's decode step."""
        if self.draft is not None:
            return int(self.draft.decode_run_ns(context.astype(np.int32), k).sum())
        if not self.draft_fraction:
            return 0
        ones = np.ones(context.shape[0], dtype=np.int32)
        return round(k * self.draft_fraction * self.step_ns(ones, context.astype(np.int32)))

    def host_ns(self, rows: int) -> int:
        """ns of host time in a step of ``rows`` rows: the profile's ``step_overhead_us`` (unless
        the fit holds it) and the serving loop's. With async scheduling (vLLM prepares step
        n+1 while step n runs) a driver overlaps it with the GPU time: the step then takes
        ``max(step_ns - host_ns, host_ns)``."""
        return round(self.overhead_ns + self._loop(rows))

    def _loop(self, rows: int) -> float:
        """ns of the serving loop's host time around a step of ``rows`` rows (0.0 without it)."""
        a, b = self.loop_ns
        return a + b * rows

    def _decode_ms_padded(self, n: int, width: int) -> float:
        """ms of a decode-only step before the real-KV term: :func:`~schedsim.cost.step_fit.combine` of every other
        feature. Memoised: a run prices the same few shapes over and over."""
        if len(self._decode_memo) >= 1 << 16:   # eager steps over ever longer contexts
            self._decode_memo.clear()
        padded = graph_batch(n, self.graph_sizes) if self.graph_sizes else 0
        if padded:   # a graph step: no serial keys (the zip in combine leaves their weight out)
            feats = step_features(1, padded, width, 0, 0, 0, 0, 0, 0)
        else:
            serial = serial_keys(n, width, self._attention, self.block_size) if self._attention else None
            bound = gpu_bound_serial_keys(n, n, width, self._attention, self.block_size) if self._gpu_bound else None
            feats = step_features(0, 0, 0, n, 0, 0, 0, n, width, serial=serial, gpu_bound_serial=bound)
        t = self._decode_memo[(n, width)] = combine(self._coef, feats)
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
