"""Lists the measured figures (a number with a unit: ``4.69x``, ``1,883 samples/s``, ``26 min``,
``95.7 %``) that README.md and the pages under docs/ state, to keep each fact in one place.

Two checks, both used by tests/test_docs_facts.py:

* **quotes**: a sentence that links to a section of docs/performance.md quotes it, so every
  figure in that sentence must appear, with the same value, in that section (where figures
  live, with their command and spread). A figure changed on the performance page and not where
  it is quoted fails here.
* **labelled figures**: a figure's label is its unit and the content words just before it in its
  sentence (``"vs pillow per core" x``). The same label with different values on two pages, or
  in two paragraphs of one page, is a fact stated twice that has drifted. A sentence that names
  a target states no measured figure: targets are left out (and must say they are targets).
* **stated defaults**: a sentence or an API entry that gives a public keyword's default
  (``"`shuffle_buffer` ... (default 1000)"``, ``"default: 64 MiB"``, ``"`max_pixels` ... 64 M by
  default"``) must give the default of the code's signature: that of the object the section
  documents (a heading naming it, as the generated reference pages have), else one of the
  defaults that keyword has anywhere in the public API (``shardstream.__all__`` and the
  framework adapters' ``__all__``). A value this script cannot read (prose) is not checked.

    python scripts/list_figures.py            # figures on two or more pages, then any problem
    python scripts/list_figures.py --check    # only the problems; exit 1 if there is one

docs/changelog.md (the changelog, history by design) and the generated reference pages are not
read for figures; for stated defaults the generated reference pages are read too (they carry the
docstrings' words).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# History by design, and the reference pages generated from the code (defaults, not measurements).
SKIPPED = {
    "docs/changelog.md",
    *(f"docs/reference/{name}.md" for name in ("api-loader", "api-text", "api-data", "api-errors")),
    "docs/reference/api-integrations.md",
    "docs/reference/cli.md",
    "docs/trainer/config.md",
}
PERFORMANCE = "docs/performance.md"

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = (
    r"x(?![\w-])|\s?%|\s(?:samples/s|images/s|documents/s|tokens/s|files/s|captions/s|row groups/s|GB/s|MB/s|"
    r"MB|GB|KB|kB|MiB|GiB|KiB|B|ms|s|min|minutes|seconds)(?![\w/])"
)
FIGURE = re.compile(rf"(?<![\w.,/-])((?:{_NUMBER})(?:\s?(?:-|–|to)\s?(?:{_NUMBER}))?)({_UNIT})")
_LINK = re.compile(r"\]\(([^)\s]*performance\.md)#([\w-]+)\)")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\[])")
_WORD = re.compile(r"[a-z][a-z0-9+-]*")
STOP = set(
    "a an the of on in at to for by with and or is are was were be its it this that these those as "
    "from per over than into about each one two three all any our their we us his her".split()
)
LABEL_WORDS = 4


@dataclass(frozen=True)
class Figure:
    page: str
    line: int
    value: str  # the number (or range) as written, thousands separators removed
    unit: str
    label: str  # unit and the content words before it, e.g. "x: vs pillow per core"
    text: str  # as written
    target: bool = False  # its sentence names a target: not a measured figure


def _unit(raw: str) -> str:
    unit = raw.strip()
    return {"minutes": "min", "seconds": "s", "kB": "KB"}.get(unit, unit)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.relative_to(ROOT).as_posix() not in SKIPPED]


def prose_paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph, with code blocks, inline code and HTML
    comments left out."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("<!--"):
            continue
        if not line.strip() or line.lstrip().startswith(("#", "|", "- ")) and current:
            if current:
                out.append((start, " ".join(current)))
            current = []
            if not line.strip():
                continue
        if not current:
            start = number
        current.append(re.sub(r"`[^`]*`", " ", line.strip()))
    if current:
        out.append((start, " ".join(current)))
    return out


def figures(path: Path) -> list[Figure]:
    page = path.relative_to(ROOT).as_posix()
    found: list[Figure] = []
    for line, text in prose_paragraphs(path):
        for match in FIGURE.finditer(text):
            value, unit = match.group(1).replace(",", ""), _unit(match.group(2))
            sentence = re.split(r"[.;:!?(|]\s", text[: match.start()])[-1].lower()
            sentence = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", sentence)  # a link's text only
            words = [w for w in _WORD.findall(sentence) if w not in STOP]
            label = f"{unit}: " + " ".join(words[-LABEL_WORDS:])
            target = bool(_TARGET.search(_sentence_of(text, match.start())))
            found.append(Figure(page, line, value, unit, label, match.group(0).strip(), target))
    return found


_TARGET = re.compile(r"\btargets?\b", re.IGNORECASE)


def _sentence_of(text: str, at: int) -> str:
    """The sentence of ``text`` around position ``at``."""
    start = 0
    for match in _SENTENCE.finditer(text):
        if match.start() >= at:
            return text[start : match.start()]
        start = match.end()
    return text[start:]


def performance_sections() -> dict[str, str]:
    """The performance page's text under each heading, by the heading's anchor."""
    sections: dict[str, str] = {}
    anchor = ""
    for line in (ROOT / PERFORMANCE).read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^#{2,3} (.*)$", line)
        if heading:
            anchor = re.sub(r"[^\w\s-]", "", heading.group(1).lower()).strip()
            anchor = re.sub(r"[\s]+", "-", anchor)
            sections[anchor] = ""
            continue
        sections[anchor] = sections.get(anchor, "") + line + "\n"
    return sections


def quote_problems() -> list[str]:
    """Figures in a sentence linking to a performance section that the section does not state."""
    sections = performance_sections()
    problems: list[str] = []
    for path in pages():
        page = path.relative_to(ROOT).as_posix()
        if page == PERFORMANCE:
            continue
        for line, paragraph in prose_paragraphs(path):
            for text in _SENTENCE.split(paragraph):
                problems += _sentence_problems(page, line, text, sections)
    return problems


def _sentence_problems(page: str, line: int, text: str, sections: dict[str, str]) -> list[str]:
    anchors = [a for _, a in _LINK.findall(text)]
    problems: list[str] = []
    for anchor in anchors:
        if anchor not in sections:
            problems.append(f"{page}:{line}: links to {PERFORMANCE}#{anchor}, which has no such section")
    stated = " ".join(sections.get(a, "") for a in anchors).replace(",", "")
    for match in FIGURE.finditer(text) if anchors else ():
        value = match.group(1).replace(",", "")
        if not re.search(rf"(?<![\d.]){re.escape(value)}(?![\d])", stated):
            where = ", ".join(f"#{a}" for a in anchors)
            problems.append(
                f"{page}:{line}: {match.group(0).strip()!r} is not in {PERFORMANCE} {where}, "
                "which its sentence links to"
            )
    return problems


def label_problems(all_figures: list[Figure]) -> list[str]:
    """The same label with different values on different pages, or in different paragraphs of
    one page (targets left out)."""
    by_label: dict[str, list[Figure]] = defaultdict(list)
    for f in all_figures:
        if len(f.label.split()) > LABEL_WORDS - 1 and not f.target:  # else: not a label
            by_label[f.label].append(f)
    problems = []
    for label, group in sorted(by_label.items()):
        values = {f.value for f in group}
        places = {(f.page, f.line) for f in group}
        if len(values) > 1 and len(places) > 1:
            seen = "; ".join(f"{f.page}:{f.line} {f.text}" for f in group)
            problems.append(f"{label!r} has {len(values)} values: {seen}")
    return problems


# -- defaults stated in the docs against the code's signatures ------------------------------------

# The framework adapters whose __all__ is public, as tests/test_api_docs.py reads them.
ADAPTERS = ("hf", "accelerate", "lightning", "open_clip")
# A stated default: "(default X" / "(default: X" / "default ``X``", "X by default" or "X (default)".
_VALUE = r"``?[^`]+``?|\([^()]*\)|-?[\d][\d,._]*(?:\s?(?:KiB|MiB|GiB|M)(?![\w]))?|True|False|None"
_DEFAULT_IS = re.compile(rf"\bdefault:?\s+(?P<v>{_VALUE})")
_BY_DEFAULT = re.compile(rf"(?P<v>{_VALUE})\s+(?:by default\b|\(default\))")
_EXPRESSION = re.compile(r"\s?(?:x|\*|/|\+|×)\s|[\d.]")
_NAME = re.compile(r"``?([a-z_][a-z0-9_]*)``?")
_OBJECT_HEADING = re.compile(r"^#{1,4}\s+`([A-Za-z_][\w.]*)`")
_ITEM = re.compile(r"^- `\**([a-z_][a-z0-9_]*)`:")


@dataclass(frozen=True)
class StatedDefault:
    page: str
    line: int
    scope: str | None  # the object the section documents (its heading), if any
    name: str  # the keyword
    written: str  # the value as written
    value: Any  # as read


def public_signatures() -> dict[str, dict[str, Any]]:
    """``{object name: {keyword: default}}`` for every public callable (and its public
    methods), by the names the reference headings use (``ShardLoader``, ``ShardLoader.dataloader``,
    ``ShardTrainer``)."""
    sys.path.insert(0, str(ROOT / "python"))
    try:
        import shardstream
    finally:
        sys.path.pop(0)
    objects: list[tuple[str, Any]] = [(n, getattr(shardstream, n)) for n in shardstream.__all__]
    for adapter in ADAPTERS:
        try:
            module = importlib.import_module(f"shardstream.integrations.{adapter}")
        except ImportError:  # its framework is not installed here
            continue
        objects += [(n, getattr(module, n)) for n in getattr(module, "__all__", [])]
    found: dict[str, dict[str, Any]] = {}
    for name, obj in objects:
        for qualname, fn in _callables(name, obj):
            try:
                parameters = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):
                continue
            found[qualname] = {
                p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty
            }
    return found


def _callables(name: str, obj: Any) -> Iterator[tuple[str, Any]]:
    if inspect.isclass(obj):
        yield name, obj
        for member, value in vars(obj).items():
            if not member.startswith("_") and inspect.isfunction(value):
                yield f"{name}.{member}", value
    elif callable(obj):
        yield name, obj


def read_value(written: str) -> Any:
    """A default as the docs write it, as a Python value; ``...`` (Ellipsis) when unreadable."""
    text = written.strip().strip("`").strip()
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text.startswith("(") and text.endswith(")"):
        parts = [read_value(part) for part in text[1:-1].split(",") if part.strip()]
        return ... if any(p is ... or isinstance(p, str) for p in parts) else tuple(parts)
    number = re.fullmatch(r"(-?\d[\d,_]*(?:\.\d+)?)(?:\s?(KiB|MiB|GiB|M))?", text)
    if number:
        scale = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "M": 1_000_000}
        return float(number.group(1).replace(",", "").replace("_", "")) * scale[number.group(2)]
    ratio = re.fullmatch(r"(\d+)\s*/\s*(\d+)", text)
    if ratio:
        return int(ratio.group(1)) / int(ratio.group(2))
    return ...


def same_default(stated: Any, actual: Any) -> bool:
    if isinstance(stated, tuple) or isinstance(actual, (tuple, list)):
        return (
            isinstance(stated, tuple)
            and isinstance(actual, (tuple, list))
            and len(stated) == len(actual)
            and all(same_default(a, b) for a, b in zip(stated, actual, strict=True))
        )
    if isinstance(stated, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return math.isclose(stated, float(actual), rel_tol=1e-3)
    return stated == actual and type(stated) is type(actual)


def stated_defaults(path: Path, known: set[str]) -> list[StatedDefault]:
    """The defaults ``path`` states for keywords in ``known``."""
    page = path.relative_to(ROOT).as_posix()
    found: list[StatedDefault] = []
    scope: str | None = None
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s", line)
        if fenced or line.lstrip().startswith("<!--"):
            continue
        if heading:
            named = _OBJECT_HEADING.match(line)
            scope = named.group(1) if named else None
            continue
        item = _ITEM.match(line)
        for clause in re.split(r"(?<=[.;])\s+", line):
            for pattern in (_DEFAULT_IS, _BY_DEFAULT):
                for match in pattern.finditer(clause):
                    if _EXPRESSION.match(clause, match.end()):
                        continue  # "default: 4 x max_patches...": a formula, not a value
                    names = [n for n in _NAME.findall(clause[: match.start()]) if n in known]
                    # An API entry ("- `name`: ...") states its own keyword's default.
                    name = item.group(1) if item and item.group(1) in known else (names or [None])[-1]
                    value = read_value(match.group("v"))
                    if name is not None and value is not ...:
                        found.append(StatedDefault(page, number, scope, name, match.group("v"), value))
    return found


def default_problems(signatures: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Defaults stated in README.md, docs/ and the generated API pages that the code's
    signatures do not have."""
    signatures = public_signatures() if signatures is None else signatures
    by_name: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for qualname, defaults in signatures.items():
        for name, value in defaults.items():
            by_name[name].append((qualname, value))
    problems: list[str] = []
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for path in (p for p in paths if p.exists()):
        if path.relative_to(ROOT).as_posix() == "docs/changelog.md":
            continue
        for stated in stated_defaults(path, set(by_name)):
            scoped = signatures.get(stated.scope or "", {})
            if stated.name in scoped:
                candidates = [(stated.scope, scoped[stated.name])]
            else:
                candidates = by_name[stated.name]
            if not any(same_default(stated.value, actual) for _, actual in candidates):
                code = "; ".join(f"{q}: {v!r}" for q, v in candidates)
                problems.append(
                    f"{stated.page}:{stated.line}: `{stated.name}` default {stated.written!r}, "
                    f"the code's is {code}"
                )
    return problems


def duplicated(all_figures: list[Figure]) -> dict[tuple[str, str], list[Figure]]:
    """Figures (value and unit) stated on two or more pages."""
    by_value: dict[tuple[str, str], list[Figure]] = defaultdict(list)
    for f in all_figures:
        by_value[(f.value, f.unit)].append(f)
    return {k: v for k, v in sorted(by_value.items()) if len({f.page for f in v}) > 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="print only problems; exit 1 if any")
    args = parser.parse_args(argv)
    all_figures = [f for p in pages() for f in figures(p)]
    if not args.check:
        for (value, unit), group in duplicated(all_figures).items():
            print(f"{value} {unit}: " + "; ".join(f"{f.page}:{f.line}" for f in group))
    problems = quote_problems() + label_problems(all_figures) + default_problems()
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
