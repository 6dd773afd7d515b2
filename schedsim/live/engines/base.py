"""What every engine runner offers the profiler (and, later, the live runner).

A runner is a context manager that owns its buffers, streams and compiled artefacts
(Polygraphy's runner pattern). Hooks, in the order they are used:

``__enter__`` / ``__exit__``
    Allocate and free everything the runner owns.
``prepare(batch, seq_len)``
    Make whatever one shape needs (buffers, a captured CUDA graph, an input binding)
    before it is timed. Raises :class:`~schedsim.errors.InputError` for a shape the
    engine cannot run (outside a TensorRT optimization profile, say).
``infer(batch, seq_len)``
    One batch, launch to completion: copy the staged inputs in, run, copy the output
    out, synchronize. Returns the host output. The host clock around this call is the
    latency a serving loop sees.
``host_input(batch, seq_len)`` (optional)
    The staging array that ``infer`` reads, so a serving loop can assemble a batch in
    place; the profiler's dispatch-overhead loop uses it.
``last_gpu_ms``
    GPU time of the last ``infer`` from events around the engine launch; NaN when
    the runner has no device clock (ONNX Runtime on the CPU).
``warnings``
    Messages worth keeping in the profile's sidecar (a CUDA-graph capture that fell back
    to eager launches, for example).
``describe()``
    A JSON-able dict of the settings and library versions, stamped into the sidecar.

:class:`Runner` implements none of the work; it documents the hooks and gives the
defaults, so a new backend is a subclass that fills in the ``*`` methods.
"""

from __future__ import annotations

import numpy as np

from schedsim.errors import InputError


class Runner:
    """Base class of engine runners; see the module docstring for the hooks."""

    warnings: list

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def prepare(self, batch: int, seq_len: int) -> None:
        raise NotImplementedError

    def infer(self, batch: int, seq_len: int):
        raise NotImplementedError

    @property
    def last_gpu_ms(self) -> float:
        return float("nan")

    def describe(self) -> dict:
        return {}


def require(module: str, package: str, purpose: str):
    """Import ``module`` or raise an InputError naming the pip package that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"{purpose} needs the Python package {package!r}, which is not "
                         f"installed here (import {module} failed: {exc})") from None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception from an engine means the device ran out of memory."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return ("out of memory" in text or "outofmemory" in text
            or "cudaerrormemoryallocation" in text or "failed to allocate" in text)


def random_inputs(specs, batch: int, seq_len: int, rng: np.random.Generator) -> dict:
    """Inputs for one shape from ``InputSpec``s: token ids below the vocabulary, masks of ones."""
    out = {}
    for spec in specs:
        shape = spec.shape_for(batch, seq_len)
        if np.issubdtype(spec.dtype, np.integer):
            lname = spec.name.lower()
            if "mask" in lname:
                out[spec.name] = np.ones(shape, dtype=spec.dtype)
            elif "type" in lname or "position" in lname:
                out[spec.name] = np.zeros(shape, dtype=spec.dtype)
            else:
                low = min(1000, spec.vocab // 2)  # BERT's first ~1000 ids are special tokens
                out[spec.name] = rng.integers(low, spec.vocab, size=shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            out[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return out
