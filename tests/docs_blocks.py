"""The fenced code blocks of README.md and docs/, as tests/test_docs_examples.py runs them.

Rules (each enforced by the tests):

* every fence names its language;
* a ``python`` or ``bash`` block is executed, unless the line right before it (blank lines
  aside) is a marker ``<!-- not-run: REASON -->`` with a non-empty reason;
* ``json`` and ``yaml`` blocks are parsed; ``text`` blocks are output, layouts and diagrams, not
  code;
* any other language needs the marker too.

A page's blocks run in order in one scratch folder, so a page reads as a session: the shards the
first block writes are there for the next. A span ``<!-- include: FILE#SECTION -->`` ...
``<!-- end include -->`` (expanded by docs/hooks.py when the site is built, so the install steps
and the quickstart are written once, in the README) is replaced by that section, as the site
renders it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = ("python", "bash")
PARSED = ("json", "yaml")
NOT_CODE = ("text",)

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*not-run:(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, in that file
    language: str
    code: str
    not_run: str | None  # the marker's reason ("" for a marker without one); None: no marker


class DocsError(ValueError):
    """A page that breaks the rules above: the message names the file and line."""


def docs_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docs_hooks() -> Any:
    """docs/hooks.py, the one reader of include spans (the site's and these tests')."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expanded_lines(path: Path) -> list[tuple[str, str, int]]:
    relative = path.relative_to(ROOT).as_posix()
    lines = [(line, relative, n) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
    try:
        return docs_hooks().expand_includes(lines)
    except ValueError as e:
        raise DocsError(str(e)) from None


def parse_blocks(lines: list[tuple[str, str, int]]) -> list[Block]:
    """The fenced blocks of a page, with the not-run marker before each; a marker that no fence
    follows, or a fence without a language, is a DocsError."""
    blocks: list[Block] = []
    marker: tuple[str, str, int] | None = None  # (reason, file, line)
    index = 0
    while index < len(lines):
        text, source, number = lines[index]
        fence = _FENCE.match(text)
        if fence:
            indent, ticks, language = fence.groups()
            body: list[str] = []
            index += 1
            while index < len(lines) and lines[index][0].strip() != ticks:
                body.append(
                    lines[index][0][len(indent) :] if lines[index][0].startswith(indent) else lines[index][0]
                )
                index += 1
            if index == len(lines):
                raise DocsError(f"{source}:{number}: a code fence that is never closed")
            if not language:
                raise DocsError(f"{source}:{number}: a code fence without a language (use text for output)")
            reason = marker[0] if marker else None
            blocks.append(Block(source, number, language, "\n".join(body) + "\n", reason))
            marker = None
        else:
            found = _MARKER.match(text)
            if found:
                if marker:
                    raise DocsError(f"{marker[1]}:{marker[2]}: a not-run marker with no code block after it")
                marker = (found.group(1).strip(), source, number)
            elif text.strip() and marker:
                raise DocsError(
                    f"{marker[1]}:{marker[2]}: a not-run marker with no code block right after it"
                )
        index += 1
    if marker:
        raise DocsError(f"{marker[1]}:{marker[2]}: a not-run marker with no code block after it")
    return blocks


def page_blocks(path: Path) -> list[Block]:
    return parse_blocks(expanded_lines(path))
