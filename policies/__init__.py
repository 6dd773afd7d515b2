"""Batching policies. ``POLICIES`` maps each ``--policy`` name to its class.

A user's own policy is named by path instead: ``path/to/file.py:MyPolicy`` or
``package.module:MyPolicy`` (see :func:`schedsim.plugins.load_policy_class`).

LLM policies (``continuous``, ``paged-kv``, ``llm-static``) decide engine steps instead of
batches (:mod:`schedsim.llm.step`); ``static`` on a trace with token columns means
``llm-static``.
"""

from policies.basic import NoBatching, StaticBatching
from policies.continuous import Continuous
from policies.dynamic import DynamicBatcher, QueuePolicy
from policies.llm_static import StaticLLM
from policies.paged_kv import PagedKV

POLICIES = {
    "none": NoBatching,
    "static": StaticBatching,
    "dynamic": DynamicBatcher,
    "continuous": Continuous,
    "paged-kv": PagedKV,
    "llm-static": StaticLLM,
}

__all__ = ["POLICIES", "NoBatching", "StaticBatching", "DynamicBatcher", "QueuePolicy",
           "Continuous", "PagedKV", "StaticLLM"]
