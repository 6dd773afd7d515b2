"""Resolve a ``--policy`` or ``--router`` value: a built-in name, ``module:Class`` or ``file.py:Class``.

Built-in names come from :data:`policies.POLICIES` and :data:`policies.routers.ROUTERS`;
anything else with a colon is a user's class, imported from a module or a file.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import typing
from collections.abc import Mapping
from pathlib import Path

from policies import POLICIES
from policies.routers import ROUTERS
from schedsim.errors import InputError


def load_class(spec: str, builtins: Mapping, flag: str, names) -> type:
    """The class ``spec`` names: ``builtins[spec]``, or a class imported from ``module:Class``
    or ``path/to/file.py:Class``. ``flag`` (``--policy``) and ``names`` (the built-in names)
    word the errors."""
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        kind = flag.lstrip("-")
        raise InputError(f"{flag}: unknown {kind} {spec!r}; expected one of "
                         f"{', '.join(names)}, or module:Class, or path/to/file.py:Class")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InputError(f"{flag}: {where}: no such file")
        mod_name = f"schedsim_user_{flag.lstrip('-')}_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file failed to import: say where, one line
            raise InputError(f"{flag}: {where}: failed to import: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"{flag}: cannot import module {where!r}: {exc}") from exc
    cls = getattr(module, name, None)
    if cls is None or not inspect.isclass(cls):
        raise InputError(f"{flag}: {where} has no class {name!r}")
    return cls


def load_policy_class(spec: str):
    """Return the policy class named by ``spec``."""
    cls = load_class(spec, POLICIES, "--policy", POLICIES)
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
    _check_types(spec, cls, sig, params)
    if spec in POLICIES:
        return cls(**params)
    try:
        return cls(**params)
    except InputError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        # A user's constructor rejecting a value (int("abc"), a missing argument): one line.
        raise InputError(f"--policy {spec}: {type(exc).__name__}: {exc}") from None


_NUMBERS = {int: (int,), float: (int, float), bool: (bool,)}


def _check_types(spec: str, cls, sig: inspect.Signature, params: dict) -> None:
    """InputError naming the parameter when a value does not have the constructor's annotated
    type (int, float or bool, optionally ``X | None``)."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: leave the checking to the constructor
        hints = {}
    for key, value in params.items():
        if key not in sig.parameters:
            continue
        hint = hints.get(key)
        args = typing.get_args(hint)
        if args and type(None) in args:
            if value is None:
                continue
            rest = [a for a in args if a is not type(None)]
            hint = rest[0] if len(rest) == 1 else None
        if hint not in _NUMBERS:
            continue
        ok = isinstance(value, _NUMBERS[hint]) and (hint is bool or not isinstance(value, bool))
        ok = ok or (hint is int and isinstance(value, float) and value.is_integer())
        if not ok:
            raise InputError(f"--param {key}={value}: {spec} takes {key} as {hint.__name__}; "
                             f"{value!r} is not one")


def load_router(spec: str, params: dict | None = None):
    """A router instance from a ``--router`` name, ``module:Class`` or ``file.py:Class``."""
    cls = load_class(spec, ROUTERS, "--router", dict.fromkeys(c.name for c in ROUTERS.values()))
    if not callable(getattr(cls, "route", None)):
        raise InputError(f"--router: {spec}: class has no route(now_ns, row, active) method")
    try:
        return cls(**(params or {}))
    except TypeError as exc:
        raise InputError(f"--router {spec}: {exc}") from None
