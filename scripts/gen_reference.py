"""Generates the reference pages (API, CLI, trainer configuration) as plain Markdown, from the
installed package itself, into the checked-in pages under docs/.

A page keeps its hand-written text; what the code says goes between a marker and
``<!-- end generated -->``:

* ``<!-- generated: api DOTTED.NAME -->``: a class or function: its signature with the real
  default values, its docstring (Google style, turned into Markdown) and, for a class, every
  public method and property, inherited ones from shardstream's own base classes included;
* ``<!-- generated: module DOTTED.MODULE -->``: a module's docstring and every name of its
  ``__all__`` (the framework adapters);
* ``<!-- generated: defaults -->``: the values of ``shardstream.DEFAULTS``;
* ``<!-- generated: cli -->``: every verb and option of the ``shardstream`` command, from its
  argparse parsers;
* ``<!-- generated: config -->``: every field of the trainer's configuration, from its dataclasses.

Why Markdown in the repository rather than a site rendered at build time: the pages read the
same on GitHub, where most people read them, as on the site; and they cannot drift, because
tests/test_reference_pages.py regenerates them and fails when the checked-in text differs.

    python scripts/gen_reference.py           # rewrite the pages
    python scripts/gen_reference.py --check   # exit 1 naming the pages that differ
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "docs/reference/api-loader.md",
    "docs/reference/api-text.md",
    "docs/reference/api-vlm.md",
    "docs/reference/api-data.md",
    "docs/reference/api-errors.md",
    "docs/reference/api-integrations.md",
    "docs/reference/cli.md",
    "docs/trainer/config.md",
]
MARKER = re.compile(r"^<!-- generated: (\w+)(?: (\S+))? -->$")
END = "<!-- end generated -->"
SIGNATURE_MARKER = "<!-- not-run: a signature, not a call -->"
EXAMPLE_MARKER = "<!-- not-run: an example from the docstring (doctest +SKIP) -->"
SECTIONS = (
    "Args",
    "Arguments",
    "Attributes",
    "Returns",
    "Yields",
    "Raises",
    "Example",
    "Examples",
    "Note",
    "Notes",
)
_SECTION = re.compile(r"^(" + "|".join(SECTIONS) + r"):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}[\w.]+)(?: \(([^)]*)\))?:\s?(.*)$")
_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")


# -- docstrings -----------------------------------------------------------------------------------


def inline(text: str) -> str:
    """reST inline markup to Markdown: ``x`` and :role:`~a.b.c` to code spans; a ``<`` outside
    code escaped (``rank-<r>.json`` is not HTML)."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).split('.')[-1] if m.group(1) else m.group(2)}`", text)
    text = _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _dedent_block(lines: list[str]) -> list[str]:
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return [line[cut:] for line in lines]


def _entries(lines: list[str]) -> list[tuple[str, str | None, str]]:
    """``name (type): text`` entries with their indented continuation lines."""
    entries: list[tuple[str, str | None, list[str]]] = []
    for line in _dedent_block(lines):
        found = _ENTRY.match(line) if line and not line[0].isspace() else None
        if found:
            entries.append((found.group(1), found.group(2), [found.group(3)]))
        elif entries:
            entries[-1][2].append(line.strip())
    return [(name, kind, " ".join(t for t in text if t)) for name, kind, text in entries]


def _prose(lines: list[str]) -> list[str]:
    """Plain docstring text: paragraphs and lists kept, ``::`` literal blocks fenced as text."""
    out: list[str] = []
    index = 0
    lines = _dedent_block(lines)
    while index < len(lines):
        line = lines[index]
        if line.rstrip().endswith("::"):
            stripped = line.rstrip()[:-2].rstrip()
            if stripped:
                out.append(inline(stripped) + ":")
            index += 1
            block: list[str] = []
            while index < len(lines) and (not lines[index].strip() or lines[index].startswith(" ")):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            out += ["", "```text", *_dedent_block(block), "```", ""]
            continue
        out.append(inline(line))
        index += 1
    return out


def _example(lines: list[str]) -> list[str]:
    code = [re.sub(r"\s*# doctest: \+SKIP$", "", line) for line in _dedent_block(lines) if line.strip()]
    return [EXAMPLE_MARKER, "```pycon", *code, "```"]


def docstring_markdown(doc: str | None) -> list[str]:
    """A Google-style docstring as Markdown lines."""
    if not doc:
        return []
    lines = inspect.cleandoc(doc).splitlines()
    chunks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in lines:
        found = _SECTION.match(line)
        if found:
            chunks.append((found.group(1), []))
        else:
            chunks[-1][1].append(line)
    out: list[str] = []
    for section, body in chunks:
        if section is None:
            out += _prose(body)
        elif section in ("Args", "Arguments", "Attributes", "Raises"):
            title = {"Args": "Arguments", "Arguments": "Arguments"}.get(section, section)
            out += ["", f"**{title}:**", ""]
            for name, kind, text in _entries(body):
                shown = f"`{name}`" + (f" ({inline(kind)})" if kind else "")
                out.append(f"- {shown}: {inline(text)}")
            out.append("")
        elif section in ("Example", "Examples"):
            out += ["", f"**{section}:**", ""]
            body = _dedent_block(body)
            code: list[str] = []
            for line in body + [""]:
                if line.startswith((">>>", "...")) or (code and line.startswith("    ") and line.strip()):
                    code.append(line)
                    continue
                if code:
                    out += _example(code)
                    code = []
                if line.strip():
                    out.append(inline(line))
            out.append("")
        else:
            out += ["", f"**{section}:** " + inline(" ".join(x.strip() for x in body if x.strip())), ""]
    return _squeeze(out)


def _squeeze(lines: list[str]) -> list[str]:
    """No leading, trailing or doubled blank lines."""
    out: list[str] = []
    for line in lines:
        line = line.rstrip()
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


# -- signatures -----------------------------------------------------------------------------------


def default_text(value: Any) -> str:
    """A default's value as Python would print it (never the expression that computed it)."""
    text = repr(value)
    if " at 0x" in text:  # an object without a stable repr: its type
        text = f"<{type(value).__name__}>"
    return text


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def signature_lines(name: str, obj: Any) -> list[str]:
    """``name(params) -> return`` with one parameter per line when it is long."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    fields = (
        {f.name: f for f in dataclasses.fields(obj)}
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj)
        else {}
    )
    params: list[str] = []
    previous_kind = None
    for p in signature.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and previous_kind not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            params.append("*")
        if previous_kind is p.POSITIONAL_ONLY and p.kind is not p.POSITIONAL_ONLY:
            params.append("/")
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        text = prefix + p.name
        annotation = _annotation(p.annotation)
        if annotation:
            text += f": {annotation}"
        if p.default is not p.empty:
            default = p.default
            field = fields.get(p.name)
            if field is not None and field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = field.default_factory()  # type: ignore[misc]
            text += f" = {default_text(default)}" if annotation else f"={default_text(default)}"
        params.append(text)
        previous_kind = p.kind
    returns = "" if inspect.isclass(obj) else _annotation(signature.return_annotation)
    tail = f" -> {returns}" if returns else ""
    one_line = f"{name}({', '.join(params)}){tail}"
    if len(one_line) <= 100:
        return [one_line]
    return [f"{name}(", *(f"    {p}," for p in params), f"){tail}"]


def _code(lines: list[str]) -> list[str]:
    return [SIGNATURE_MARKER, "```python", *lines, "```"] if lines else []


# -- objects --------------------------------------------------------------------------------------


def resolve(dotted: str) -> Any:
    module_name, _, attr = dotted.rpartition(".")
    try:
        return importlib.import_module(dotted)
    except ImportError:
        return getattr(importlib.import_module(module_name), attr)


def public_name(obj: Any) -> str:
    """``shardstream.X`` when the package exports it, else its defining module's name."""
    import shardstream

    name = obj.__name__
    if name in shardstream.__all__:
        return f"shardstream.{name}"
    return f"{obj.__module__}.{name}"


def _ours(cls: type) -> bool:
    return cls.__module__.startswith("shardstream")


def members(cls: type) -> Iterator[tuple[str, Any, type]]:
    """Public methods and properties of ``cls`` and of shardstream's own classes it inherits
    from: (name, member, the class that defines it), the class's own first, in source order."""
    seen: set[str] = set()
    for owner in cls.__mro__:
        if owner is object or not _ours(owner):
            continue
        for name, value in vars(owner).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if not (inspect.isfunction(value) or isinstance(value, property)):
                continue
            seen.add(name)
            yield name, value, owner


def render_member(cls: type, name: str, value: Any, owner: type, level: int) -> list[str]:
    heading = "#" * level
    out = [f"{heading} `{cls.__name__}.{name}`", ""]
    if owner is not cls:
        out += [f"*Inherited from `{owner.__module__}.{owner.__name__}`.*", ""]
    if isinstance(value, property):
        kind = "property" + ("" if value.fset else ", read-only")
        out += [f"*{kind}*", ""]
        doc = value.__doc__
    else:
        out += _code(signature_lines(name, value)) + [""]
        doc = inspect.getdoc(getattr(cls, name))
    return out + docstring_markdown(doc) + [""]


def render_object(dotted: str, level: int = 2) -> list[str]:
    obj = resolve(dotted)
    heading = "#" * level
    kind = "class" if inspect.isclass(obj) else "function"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        kind = "exception"
    out = [f"{heading} `{obj.__name__}`", ""]
    where = public_name(obj)
    defined = "" if where == f"{obj.__module__}.{obj.__name__}" else f", defined in `{obj.__module__}`"
    out += [f"*{kind}* `{where}`{defined}", ""]
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        bases = ", ".join(f"`{b.__name__}`" for b in obj.__bases__)
        out += [f"Subclass of {bases}.", ""]
        out += _code([line.removesuffix(" -> None") for line in signature_lines(obj.__name__, obj.__init__)])
        out += [""]
    else:
        out += _code(signature_lines(obj.__name__, obj)) + [""]
    out += docstring_markdown(inspect.getdoc(obj) if not inspect.isclass(obj) else obj.__doc__) + [""]
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        if init is not None and inspect.isfunction(init) and init.__doc__:
            out += docstring_markdown(init.__doc__) + [""]
        for name, value, owner in members(obj):
            out += render_member(obj, name, value, owner, level + 1)
    return _squeeze(out)


def render_module(dotted: str) -> list[str]:
    module = importlib.import_module(dotted)
    out = [f"## `{dotted}`", ""] + docstring_markdown(module.__doc__) + [""]
    for name in getattr(module, "__all__", []):
        out += render_object(f"{dotted}.{name}", level=3) + [""]
    return _squeeze(out)


def render_defaults() -> list[str]:
    from shardstream import DEFAULTS

    out = ["| option | default |", "|---|---|"]
    for f in dataclasses.fields(DEFAULTS):
        out.append(f"| `{f.name}` | `{default_text(getattr(DEFAULTS, f.name))}` |")
    return out


# -- CLI ------------------------------------------------------------------------------------------


def render_cli() -> list[str]:
    from shardstream.cli import build_parser

    # argparse wraps usage lines at $COLUMNS: fixed here, so the page does not depend on the
    # terminal that generates it.
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        sections = [_parser_section("shardstream", parser)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    sections.append(_parser_section(f"shardstream {name}", sub))
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n\n".join(sections).splitlines()


def _parser_section(title: str, parser: argparse.ArgumentParser) -> str:
    out = [f"## `{title}`", ""]
    if parser.description:
        out += [_cell(parser.description.strip()), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            verbs = ", ".join(f"`{name}`" for name in action.choices)
            rows.append(("`VERB`", verbs, ""))
            continue
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.metavar and action.option_strings:
            names += f" `{action.metavar}`"
        elif action.choices and action.option_strings and action.nargs != 0:
            names += " `{" + ",".join(str(c) for c in action.choices) + "}`"
        rows.append((names, _cell(_help_text(action)), _cli_default(action)))
    out += ["| argument | meaning | default |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if parser.epilog:
        out += ["", "```text", parser.epilog.strip(), "```"]
    return "\n".join(out)


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    try:  # argparse's own %(default)s etc. expansions, as --help shows them
        text = text % {**vars(action), "prog": ""}
    except (KeyError, TypeError, ValueError):
        pass
    return " ".join(text.split())


def _cli_default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    if isinstance(action.default, list | tuple) and not action.default:
        return ""
    return f"`{action.default}`"


def _cell(text: str) -> str:
    """Text for one line or table cell: ``|`` escaped, ``<`` outside code escaped."""
    return inline(" ".join(text.split())).replace("|", "\\|")


# -- trainer configuration ------------------------------------------------------------------------


def render_config() -> list[str]:
    from shardstream.train.config import SECTIONS as CONFIG_SECTIONS

    out: list[str] = []
    for section, cls in CONFIG_SECTIONS.items():
        out += [f"## `{section}`", "", _cell((cls.__doc__ or "").strip()), ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append(
                f"| `{section}.{f.name}` | {_cell(_type_text(hints[f.name]))} | `{default!r}` "
                f"| {_cell(f.metadata.get('doc', ''))} |"
            )
        out.append("")
    return _squeeze(out)


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_text(typing.get_args(tp)[0])}"
    return f"`{getattr(tp, '__name__', str(tp))}`"


# -- pages ----------------------------------------------------------------------------------------

RENDERERS: dict[str, Callable[..., list[str]]] = {
    "api": render_object,
    "module": render_module,
    "defaults": lambda _=None: render_defaults(),
    "cli": lambda _=None: render_cli(),
    "config": lambda _=None: render_config(),
}


def generate(text: str, where: str = "page") -> str:
    """The page with every generated span rewritten from the code."""
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        found = MARKER.match(lines[index])
        out.append(lines[index])
        index += 1
        if not found:
            continue
        kind, arg = found.groups()
        if kind not in RENDERERS:
            raise ValueError(f"{where}:{index}: unknown generated kind {kind!r}")
        end = next((j for j in range(index, len(lines)) if lines[j] == END), None)
        if end is None:
            raise ValueError(f"{where}:{index}: no {END} after the marker")
        rendered = RENDERERS[kind](arg) if arg else RENDERERS[kind]()
        out += ["", *rendered, "", END]
        index = end + 1
    return "\n".join(out) + "\n"


def pages() -> dict[str, tuple[str, str]]:
    """Each page: (the checked-in text, the text the code gives)."""
    result = {}
    for page in PAGES:
        current = (ROOT / page).read_text(encoding="utf-8")
        result[page] = (current, generate(current, page))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    stale = []
    for page, (current, fresh) in pages().items():
        if current != fresh:
            stale.append(page)
            if not args.check:
                (ROOT / page).write_text(fresh, encoding="utf-8")
    if args.check and stale:
        print("out of date (run python scripts/gen_reference.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    for page in stale:
        print("wrote", page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
