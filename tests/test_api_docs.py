"""Every public name of ``shardstream`` and of ``shardstream.integrations.*`` is documented: a
docstring on each class, function, method and property, and an ``Args:`` entry (``Attributes:``
for a dataclass's fields) for every parameter of its signature, in Google style."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
import shardstream

INTEGRATIONS = ("accelerate", "hf", "lightning", "open_clip")
SECTION = re.compile(
    r"^\s*(Args|Arguments|Attributes|Returns|Yields|Raises|Example|Examples|Note|Notes):\s*$"
)
ENTRY = re.compile(r"^(\s+)(\*{0,2}\w+)(?: \([^)]*\))?:")
DATA = (shardstream.DEFAULTS, shardstream.__version__)


def documented_entries(doc: str, sections: tuple[str, ...]) -> set[str]:
    """The names given an entry in the docstring's ``sections`` (``*args``/``**kw`` as ``args``/``kw``)."""
    names: set[str] = set()
    current, indent = None, None
    for line in doc.splitlines():
        header = SECTION.match(line)
        if header:
            current, indent = header.group(1), None
            continue
        if current not in sections or not line.strip():
            continue
        entry = ENTRY.match(line)
        if entry and (indent is None or len(entry.group(1)) == indent):
            indent = len(entry.group(1))
            names.add(entry.group(2).lstrip("*"))
    return names


def _ours(obj: Any) -> bool:
    return getattr(obj, "__module__", "").startswith("shardstream")


def public_objects() -> Iterator[tuple[str, Any]]:
    for name in shardstream.__all__:
        value = getattr(shardstream, name)
        if not any(value is d for d in DATA):
            yield f"shardstream.{name}", value
    for adapter in INTEGRATIONS:
        module = importlib.import_module(f"shardstream.integrations.{adapter}")
        names = getattr(module, "__all__", None)
        assert names is not None, f"shardstream.integrations.{adapter} has no __all__"
        for name in names:
            yield f"shardstream.integrations.{adapter}.{name}", getattr(module, name)


def members(qualname: str, cls: type) -> Iterator[tuple[str, Any]]:
    """The class's own public methods and properties (inherited ones are their framework's)."""
    for name, value in vars(cls).items():
        if name.startswith("_") or not (inspect.isfunction(value) or isinstance(value, property)):
            continue
        yield f"{qualname}.{name}", value


def problems_of(qualname: str, obj: Any) -> list[str]:
    found: list[str] = []
    doc = inspect.getdoc(obj) if not isinstance(obj, property) else obj.__doc__
    if not doc or not doc.strip():
        return [f"{qualname}: no docstring"]
    if isinstance(obj, property):
        return found
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            params = [f.name for f in dataclasses.fields(obj)]
            entries = documented_entries(doc, ("Args", "Arguments", "Attributes"))
        elif issubclass(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple: its fields
            params = list(obj._fields)
            entries = documented_entries(doc, ("Attributes",))
        else:
            init = obj.__dict__.get("__init__")
            params = _parameters(init) if init is not None and _ours(init) else []
            init_doc = inspect.getdoc(init) if init is not None and init.__doc__ else ""
            entries = documented_entries(doc + "\n" + (init_doc or ""), ("Args", "Arguments"))
        found += [f"{qualname}: parameter {p!r} has no entry" for p in params if p not in entries]
        for member_name, member in members(qualname, obj):
            found += problems_of(member_name, member)
        return found
    if callable(obj):
        entries = documented_entries(doc, ("Args", "Arguments"))
        found += [
            f"{qualname}: parameter {p!r} has no Args: entry" for p in _parameters(obj) if p not in entries
        ]
    return found


def _parameters(fn: Any) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in signature.parameters if p not in ("self", "cls")]


def test_the_checker_finds_what_it_is_for():
    """The test below can fail: an undocumented parameter and a missing docstring are found."""

    def half_documented(a: int, b: int, **rest: Any) -> None:
        """Does a thing.

        Args:
            a: One.
            **rest: The others.
        """

    def bare(x: int) -> None:
        pass

    assert problems_of("f", half_documented) == ["f: parameter 'b' has no Args: entry"]
    assert problems_of("g", bare) == ["g: no docstring"]


def test_the_public_names_include_the_exports_the_issue_asks_for():
    for name in ("ShardWriter", "build_index", "ShardError", "NotFoundError", "SourceOptions", "Batch"):
        assert name in shardstream.__all__


@pytest.mark.parametrize(
    ("qualname", "obj"), list(public_objects()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_public_name_and_parameter_is_documented(qualname, obj):
    assert problems_of(qualname, obj) == []
