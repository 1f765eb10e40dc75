"""The reference pages (API, CLI, trainer configuration) are Markdown generated from the code by
scripts/gen_reference.py and checked in, so GitHub shows them as the site does. Here they are
generated again: a page that differs from what the code gives fails, naming the command that
rewrites it. And no page of README.md or docs/ shows GitHub a raw mkdocs directive."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_reference  # noqa: E402

sys.path.pop(0)


@pytest.mark.parametrize("page", gen_reference.PAGES)
def test_checked_in_reference_page_is_what_the_code_gives(page: str) -> None:
    current = (ROOT / page).read_text(encoding="utf-8")
    fresh = gen_reference.generate(current, page)
    if current != fresh:
        diff = "".join(
            difflib.unified_diff(current.splitlines(True), fresh.splitlines(True), page, "generated", n=1)
        )
        pytest.fail(f"{page} is out of date: run `python scripts/gen_reference.py`\n{diff[:4000]}")


def test_no_page_shows_github_a_raw_directive() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        inside_code = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                inside_code = not inside_code
            if inside_code or line.lstrip().startswith("<!--"):
                continue
            line = re.sub(r"`[^`]*`", "", line)  # inline code shows as code, not as a directive
            assert not line.startswith(":::"), f"{page.name}:{number}: a mkdocstrings directive"
            assert "--8<--" not in line, f"{page.name}:{number}: a snippet include"


def test_defaults_render_as_values_not_expressions() -> None:
    loader = "\n".join(gen_reference.render_object("shardstream.loader.ShardLoader"))
    assert "image_size: int = 224" in loader and "LoaderConfig." not in loader.split("```")[1]
    counts = "\n".join(gen_reference.render_object("shardstream.kinds.text.count_tokens"))
    assert "max_document_bytes: int = 67108864" in counts


def test_inherited_members_are_rendered() -> None:
    for name in ("shardstream.kinds.text.TextLoader", "shardstream.kinds.naflex_budget.NaFlexBudgetLoader"):
        page = "\n".join(gen_reference.render_object(name))
        short = name.rsplit(".", 1)[1]
        for member in ("set_epoch", "state_dict", "load_state_dict", "dataloader", "batches_per_epoch"):
            assert f"### `{short}.{member}`" in page, (name, member)
        assert "*Inherited from `shardstream.kinds.unit_plan.UnitPlanLoader`.*" in page


def test_docstring_sections_become_markdown() -> None:
    doc = """Does a thing with ``x`` (see :class:`~shardstream.ShardLoader`).

    Args:
        x: The first,
            continued.
        **rest: The others.

    Raises:
        OptionError: When ``x < 0``.

    Example:
        >>> f(1)  # doctest: +SKIP
    """
    lines = gen_reference.docstring_markdown(doc)
    assert lines[0] == "Does a thing with `x` (see `ShardLoader`)."
    assert "- `x`: The first, continued." in lines and "- `**rest`: The others." in lines
    assert "- `OptionError`: When `x < 0`." in lines
    assert lines[-3:] == ["```pycon", ">>> f(1)", "```"]
