"""mkdocs build hooks: the reference pages that must never drift from the code are rendered here,
at build time, from the code itself.

* ``<!-- generated: cli-reference -->`` becomes every verb of the ``shardstream`` command, read
  from its argparse parsers (``shardstream.cli.build_parser``);
* ``<!-- generated: config-reference -->`` becomes every field of the trainer's configuration,
  read from its dataclasses (``shardstream.train.config``): type, default, documentation;
* on any page, a table cell that names a trainer field as `` `section.field` `` must name a field
  that exists (the open_clip_train flag table would otherwise rot silently): a warning, which
  ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import typing
from typing import Any

log = logging.getLogger("mkdocs.hooks.shardstream")

CLI_MARKER = "<!-- generated: cli-reference -->"
CONFIG_MARKER = "<!-- generated: config-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    for problem in unknown_config_fields(markdown):
        log.warning("%s: %s", page.file.src_uri, problem)
    return markdown


# -- CLI ------------------------------------------------------------------------------------------


def cli_reference() -> str:
    from shardstream.cli import build_parser

    # argparse wraps usage lines at $COLUMNS: fixed here, so the page does not depend on the
    # terminal that builds the site.
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        sections = [_parser_section("shardstream", parser, level=2)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    sections.append(_parser_section(f"shardstream {name}", sub, level=2))
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n\n".join(sections)


def _parser_section(title: str, parser: argparse.ArgumentParser, *, level: int) -> str:
    out = [f"{'#' * level} `{title}`", ""]
    if parser.description:
        out += [_escape(parser.description.strip()), ""]
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
        rows.append((names, _escape(_help_text(action)), _default(action)))
    out += ["| argument | meaning | default |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if parser.epilog:
        out += ["", "```text", parser.epilog.strip(), "```"]
    return "\n".join(out)


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    # argparse's own %(default)s etc. expansions, as --help shows them.
    try:
        text = text % {**vars(action), "prog": ""}
    except (KeyError, TypeError, ValueError):
        pass
    return " ".join(text.split())


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    if isinstance(action.default, list | tuple) and not action.default:
        return ""
    return f"`{action.default}`"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- trainer configuration -------------------------------------------------------------------------


def config_reference() -> str:
    from shardstream.train.config import SECTIONS

    out = []
    for section, cls in SECTIONS.items():
        out += [f"## `{section}`", "", _escape((cls.__doc__ or "").strip()), ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append(
                f"| `{section}.{f.name}` | {_escape(_type_text(hints[f.name]))} | `{default!r}` "
                f"| {_escape(f.metadata.get('doc', ''))} |"
            )
        out.append("")
    return "\n".join(out)


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_text(typing.get_args(tp)[0])}"
    return f"`{getattr(tp, '__name__', str(tp))}`"


_FIELD_IN_CELL = re.compile(r"`([a-z_]+)\.([a-z_0-9]+)`")


def unknown_config_fields(markdown: str) -> list[str]:
    from shardstream.train.config import SECTIONS

    known = {section: {f.name for f in dataclasses.fields(cls)} for section, cls in SECTIONS.items()}
    problems = []
    for line in markdown.splitlines():
        if not line.startswith("|"):
            continue
        for section, name in _FIELD_IN_CELL.findall(line):
            if section in known and name not in known[section]:
                problems.append(f"`{section}.{name}` is not a field of the trainer's configuration")
    return problems
