"""Batching policies. ``POLICIES`` maps each ``--policy`` name to its class.

A user's own policy is named by path instead: ``path/to/file.py:MyPolicy`` or
``package.module:MyPolicy`` (see :func:`schedsim.plugins.load_policy_class`).
"""

from policies.basic import NoBatching, StaticBatching
from policies.dynamic import DynamicBatcher, QueuePolicy

POLICIES = {
    "none": NoBatching,
    "static": StaticBatching,
    "dynamic": DynamicBatcher,
}

__all__ = ["POLICIES", "NoBatching", "StaticBatching", "DynamicBatcher", "QueuePolicy"]
