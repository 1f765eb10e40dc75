"""Lists the measured figures (a number with a unit: ``4.69x``, ``1,883 samples/s``, ``26 min``,
``95.7 %``) that README.md and the pages under docs/ state, to keep each fact in one place.

Two checks, both used by tests/test_docs_facts.py:

* **quotes**: a sentence that links to a section of docs/performance.md quotes it, so every
  figure in that sentence must appear, with the same value, in that section (where figures
  live, with their command and spread). A figure changed on the performance page and not where
  it is quoted fails here.
* **labelled figures**: a figure's label is its unit and the content words just before it in its
  sentence (``"vs pillow per core" x``). The same label with different values on two pages is a
  fact stated twice that has drifted.

    python scripts/list_figures.py            # figures on two or more pages, then any problem
    python scripts/list_figures.py --check    # only the problems; exit 1 if there is one

docs/changelog.md (the changelog, history by design) and the generated reference pages are not
read.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

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
    r"x(?![\w-])|\s?%|\s(?:samples/s|tokens/s|files/s|captions/s|row groups/s|GB/s|MB/s|"
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
            found.append(Figure(page, line, value, unit, label, match.group(0).strip()))
    return found


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
    """The same label with different values on different pages."""
    by_label: dict[str, list[Figure]] = defaultdict(list)
    for f in all_figures:
        if len(f.label.split()) > LABEL_WORDS - 1:  # too little context: not a label
            by_label[f.label].append(f)
    problems = []
    for label, group in sorted(by_label.items()):
        values = {f.value for f in group}
        pages_ = {f.page for f in group}
        if len(values) > 1 and len(pages_) > 1:
            seen = "; ".join(f"{f.page}:{f.line} {f.text}" for f in group)
            problems.append(f"{label!r} has {len(values)} values: {seen}")
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
    problems = quote_problems() + label_problems(all_figures)
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
