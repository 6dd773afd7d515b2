"""Resolve a ``--policy`` value: a built-in name, ``module:Class`` or ``file.py:Class``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

from schedsim.errors import InputError


def load_policy_class(spec: str):
    """Return the policy class named by ``spec``."""
    from policies import POLICIES

    if spec in POLICIES:
        return POLICIES[spec]
    if ":" not in spec:
        raise InputError(f"--policy: unknown policy {spec!r}; expected one of "
                         f"{', '.join(POLICIES)}, or module:Class, or path/to/file.py:Class")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InputError(f"--policy: {where}: no such file")
        mod_name = f"schedsim_user_policy_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file failed to import: say where, one line
            raise InputError(f"--policy: {where}: failed to import: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"--policy: cannot import module {where!r}: {exc}") from exc
    cls = getattr(module, name, None)
    if cls is None or not inspect.isclass(cls):
        raise InputError(f"--policy: {where} has no class {name!r}")
    if not callable(getattr(cls, "decide", None)) and not callable(getattr(cls, "schedule", None)):
        raise InputError(f"--policy: {spec}: class has no decide(now_ns, idle) method "
                         f"(request-level) nor schedule(now_ns) method (LLM)")
    return cls


def build_policy(spec: str, params: dict):
    """Instantiate the policy with ``params``; unknown parameter names are an InputError."""
    cls = load_policy_class(spec)
    sig = inspect.signature(cls)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in params if k not in sig.parameters and not accepts_any]
    if unknown:
        known = ", ".join(p for p in sig.parameters if p != "self") or "none"
        raise InputError(f"--policy {spec}: unknown parameter {unknown[0]!r}; it accepts: {known}")
    return cls(**params)
