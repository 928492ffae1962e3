"""Settings' valid ranges and choices, declared with the setting (:mod:`rag_lab.core.config` checks them).

A parameter or dataclass field typed ``Annotated[float, Range(0, 1)]`` (or an alias below), or
``Annotated[str, OneOf("a", "b")]``, carries its valid values with its declaration; ``X | None`` and
``list[X]`` / ``tuple[X, ...]`` of such a type carry them too (``None`` passes, a list's items are checked
one by one). :func:`check_ranges` applies them to settings built outside a config.
"""

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from omegaconf import ListConfig


@dataclass(frozen=True)
class Range:
    """A numeric setting's valid range: ``lr: Annotated[float, Range(0, open_min=True)]`` is > 0,
    ``Range(0, 1)`` is [0, 1]; either end may be missing (None) or open.

    >>> Range(0, 1, open_min=True).why(0)
    'must be in (0, 1], got 0'
    >>> Range(1).why(0), Range(1).why(2)
    ('must be >= 1, got 0', None)
    """

    min: float | None = None
    max: float | None = None
    open_min: bool = False
    open_max: bool = False

    def why(self, value: Any) -> str | None:
        """None when ``value`` is in the range (or not a number: the schema's type check says that)."""
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        low = self.min is None or (value > self.min if self.open_min else value >= self.min)
        high = self.max is None or (value < self.max if self.open_max else value <= self.max)
        return None if low and high else f"must be {self}, got {value}"

    def __str__(self) -> str:
        if self.max is None:
            return f"{'>' if self.open_min else '>='} {self.min:g}"
        if self.min is None:
            return f"{'<' if self.open_max else '<='} {self.max:g}"
        return f"in {'(' if self.open_min else '['}{self.min:g}, {self.max:g}{')' if self.open_max else ']'}"


@dataclass(frozen=True)
class OneOf:
    """A choice setting's options: ``critic: Annotated[str, OneOf("shared", "separate")]``."""

    choices: tuple

    def __init__(self, *choices):
        object.__setattr__(self, "choices", tuple(choices))

    def why(self, value: Any) -> str | None:
        if value in self.choices:
            return None
        return f"{value!r} is not one of {', '.join(map(str, self.choices))}"


def AtLeast(bound: float) -> Range:  # noqa: N802 - reads as the type annotation it builds
    """A lower bound: ``k: Annotated[int, AtLeast(1)] = 5``."""
    return Range(min=bound)


PositiveInt = Annotated[int, Range(1)]
Positive = Annotated[float, Range(0, open_min=True)]
NonNegative = Annotated[float, Range(0)]
NonNegativeInt = Annotated[int, Range(0)]
Probability = Annotated[float, Range(0, 1)]
# (0, 1]: top_p, a share that must not be empty
OpenUnit = Annotated[float, Range(0, 1, open_min=True)]
# [0, 1): dropout
Dropout = Annotated[float, Range(0, 1, open_max=True)]
CHECKS = (Range, OneOf)


def strip_annotated(hint: Any) -> tuple[Any, list]:
    """``Annotated[int, Range(1)]`` -> ``(int, [Range(1)])``, also inside ``X | None`` and ``list[X]`` /
    ``tuple[X, ...]`` (the checks then apply to each item); any other hint passes through."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        base, *extras = args
        return base, [x for x in extras if isinstance(x, CHECKS)]
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        [inner] = [a for a in args if a is not type(None)]
        base, checks = strip_annotated(inner)
        return (base | None, checks) if checks else (hint, [])
    if origin in (list, tuple) and args:
        base, checks = strip_annotated(args[0])
        if checks and (origin is list or args[1:] in ((), (Ellipsis,))):
            return (list[base] if origin is list else tuple[base, ...]), checks
    return hint, []


def field_checks(f: dataclasses.Field) -> tuple:
    checks = tuple(f.metadata.get("checks", ()))
    return checks + ((Range(f.metadata["min"]),) if "min" in f.metadata else ())


def problems(checks: tuple, value: Any) -> str | None:
    """Why ``value`` (or, for a list, one of its items) fails one of ``checks``; None when it passes."""
    if value is None or not checks:
        return None
    items = list(value) if isinstance(value, list | tuple | ListConfig) else [value]
    for item in items:
        for check in checks:
            if why := check.why(item):
                return why if len(items) == 1 and item is value else f"{why} (in {list(items)})"
    return None


def check_ranges(fn: Callable, settings: dict, prefix: str = "") -> list[tuple[str, str]]:
    """The declared ranges and choices (module docstring) of ``fn``'s parameters (a class: its
    ``__init__``; a dataclass: its fields) that ``settings`` breaks, as ``(key, why)`` pairs: what a
    component built outside a config checks."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    hints = typing.get_type_hints(target, include_extras=True)
    out = []
    for name, value in settings.items():
        if name in hints and (why := problems(tuple(strip_annotated(hints[name])[1]), value)):
            out.append((f"{prefix}{name}", why))
    return out
