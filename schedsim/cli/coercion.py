"""Converting a command's plain option values without pydantic (``run``'s start-up).

Typer (0.29) converts every option's value through a pydantic ``TypeAdapter`` that it
builds when the command parses: importing pydantic and building one adapter per option
cost about 0.07 s of CPU on every ``schedsim run`` (its 62 options). Most values are in the
plain form of their type (``64``, ``0.5``, ``out/run1``), which pydantic turns into exactly
what ``int()``, ``float()`` and ``Path()`` give; :class:`PlainCommand` converts those
itself and hands every other value (``1_000``, `` 7``, ``7.0`` for an int, any bad value) to
Typer's own coercion, so what is accepted, what it becomes and every error message stay
Typer's. ``tests/cli/test_coercion.py`` compares both on random text.

Typer has no public hook for this: the command reads each parameter's ``type_descriptor`` and
sets its cached ``_runtime_param``. Where a Typer release lacks them, nothing is changed
and Typer's coercion runs as usual (slower, never different).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

from typer.core import TyperCommand

try:  # Typer's coercion layer (present in 0.29; absent in other releases: see the module's docstring)
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed Typer
    RuntimeParam = None

# The plain spellings: within them Python's int() and float() agree with pydantic's lax
# parsing (both round decimal text correctly); pydantic also takes spaces, underscores
# and "7.0" for an int, which go to Typer's coercion.
_INT = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT = re.compile(r"[+-]?[0-9]{1,15}(?:\.[0-9]{1,15})?(?:[eE][+-]?[0-9]{1,3})?")
_SLOW = object()


def _plain_int(text):
    return int(text) if type(text) is str and _INT.fullmatch(text) else (text if type(text) is int else _SLOW)


def _plain_float(text):
    return float(text) if type(text) is str and _FLOAT.fullmatch(text) else (
        text if type(text) is float else _SLOW)


def _plain_str(text):
    return text if type(text) is str else _SLOW


def _plain_path(text):
    # A path Path() leaves as written (Typer's error messages quote the text as given), and
    # no NUL (os.stat's error reaches the user through pydantic's wording).
    if type(text) is str and text and "\x00" not in text and str(Path(text)) == text:
        return Path(text)
    return _SLOW


def _plain_bool(value):
    return value if type(value) is bool else _SLOW


_PLAIN = {int: _plain_int, float: _plain_float, str: _plain_str, bool: _plain_bool, Path: _plain_path}


def _is_default_path(info) -> bool:
    """Path options with Typer's defaults (no ``exists``, ``resolve_path``, dash or path type)."""
    return (not info.exists and not info.resolve_path and not info.allow_dash and info.path_type is None
            and info.parser is None)


if RuntimeParam is not None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _PlainParam(RuntimeParam):
        """Converts plain values itself; the rest, as Typer would (its own runtime param)."""

        convert: Any = None
        many: bool = False
        descriptor: Any = None

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            if self.many:
                out = [self.convert(v) for v in value] if isinstance(value, (list, tuple)) else [_SLOW]
                if _SLOW not in out:
                    return self._checked(out, param, ctx)
            else:
                out = self.convert(value)
                if out is not _SLOW:
                    return self._checked(out, param, ctx) if isinstance(out, Path) else out
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

        def _checked(self, out, param, ctx):
            # What Typer does after pydantic made the Path: stat it and check the path flags.
            if self.convert is not _plain_path:
                return out
            info = self.parameter_info
            if isinstance(out, list):
                return [coerce_cli_path(p, info, path_type=Path, param=param, ctx=ctx) for p in out]
            return coerce_cli_path(out, info, path_type=Path, param=param, ctx=ctx)


def _plain_param(param):
    """A faster runtime param for ``param``, or None when Typer's own is needed."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or descriptor.file_annotation is not None:
        return None
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if info.parser is not None or info.min is not None or info.max is not None or info.clamp:
        return None
    many = get_origin(annotation) is list
    leaf = get_args(annotation)[0] if many else annotation
    convert = _PLAIN.get(leaf)
    if convert is None or (leaf is Path and not _is_default_path(info)):
        return None
    return _PlainParam(parameter_info=info, annotation=annotation, convert=convert, many=many,
                       descriptor=descriptor)


def make_plain(param) -> None:
    """Give ``param`` the plain conversion (see the module) when it can take one."""
    if RuntimeParam is not None and getattr(param, "_runtime_param", _SLOW) is None:
        fast = _plain_param(param)
        if fast is not None:
            param._runtime_param = fast


class PlainParams:
    """Mixin for a Typer command or group: its parameters, ``--help`` included, convert plain
    values without pydantic (see the module)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            make_plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            make_plain(option)
        return option


class PlainCommand(PlainParams, TyperCommand):
    """A Typer command whose plain option values are converted without pydantic."""
