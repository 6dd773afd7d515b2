"""Batching policies. ``POLICIES`` maps each ``--policy`` name to its class.

A user's own policy is named by path instead: ``path/to/file.py:MyPolicy`` or
``package.module:MyPolicy`` (see :func:`schedsim.registry.load_policy_class`).

LLM policies (``continuous``, ``paged-kv``, ``llm-static``) decide engine steps instead of
batches (:mod:`schedsim.core.llm_policy`); ``static`` on a trace with token columns means
``llm-static``.

The LLM policy modules are imported on first use, so that a request-level run does not
pay for them (with the KV-cache and LLM helper modules they take 20-100 ms to import):
``POLICIES["continuous"]`` or ``from policies import Continuous`` imports them then.
"""

from collections.abc import Iterator, Mapping
from importlib import import_module

from policies.basic import NoBatching, StaticBatching
from policies.dynamic import DynamicBatcher, QueuePolicy

# Class name -> module of the policies imported on first use.
_LAZY = {"Continuous": "policies.continuous", "PagedKV": "policies.paged_kv", "StaticLLM": "policies.llm_static"}


def __getattr__(name: str):
    if name in _LAZY:
        cls = getattr(import_module(_LAZY[name]), name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Policies(Mapping):
    """A read-only ``--policy`` name -> class mapping whose LLM classes import on lookup."""

    def __init__(self, entries: dict):
        self._entries = entries  # name -> class, or the class name in _LAZY

    def __getitem__(self, name: str):
        value = self._entries[name]
        return __getattr__(value) if isinstance(value, str) else value

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return repr(dict(self))


POLICIES = _Policies({
    "none": NoBatching,
    "static": StaticBatching,
    "dynamic": DynamicBatcher,
    "continuous": "Continuous",
    "paged-kv": "PagedKV",
    "llm-static": "StaticLLM",
})

__all__ = ["POLICIES", "NoBatching", "StaticBatching", "DynamicBatcher", "QueuePolicy",
           "Continuous", "PagedKV", "StaticLLM"]
