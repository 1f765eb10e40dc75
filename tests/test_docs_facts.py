"""One statement per fact (issue 42): a measured figure lives on docs/performance.md with its
command and spread, and other pages quote it from there. scripts/list_figures.py lists the
figures stated on two or more pages and finds the two ways a fact stated twice drifts: a quote
that no longer matches the performance section it links to, and the same labelled figure with
different values on two pages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import list_figures  # noqa: E402

sys.path.pop(0)


def test_no_figure_has_two_values_across_readme_and_docs() -> None:
    assert list_figures.quote_problems() == []
    everything = [f for page in list_figures.pages() for f in list_figures.figures(page)]
    assert list_figures.label_problems(everything) == []


def test_the_lister_finds_figures_stated_twice() -> None:
    everything = [f for page in list_figures.pages() for f in list_figures.figures(page)]
    twice = list_figures.duplicated(everything)
    # The README quotes the decode spread from the performance page: listed, with both pages.
    pages = {f.page for f in twice[("5.85-6.04", "x")]}
    assert pages == {"README.md", "docs/performance.md"}


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "performance.md").write_text(
        "# Performance\n\n## Decode, per core\n\nSeven runs: 4.46-4.69x webdataset + Pillow per core.\n"
    )
    monkeypatch.setattr(list_figures, "ROOT", tmp_path)
    monkeypatch.setattr(list_figures, "SKIPPED", set())
    return tmp_path


def test_a_stale_quote_is_found(site: Path) -> None:
    readme = site / "README.md"
    readme.write_text("Per core, 4.46-4.69x Pillow ([Decode](docs/performance.md#decode-per-core)).\n")
    assert list_figures.quote_problems() == []
    readme.write_text("Per core, 4.69-4.90x Pillow ([Decode](docs/performance.md#decode-per-core)).\n")
    (problem,) = list_figures.quote_problems()
    assert "README.md:1: '4.69-4.90x' is not in docs/performance.md #decode-per-core" in problem
    readme.write_text("Per core ([Decode](docs/performance.md#no-such-section)).\n")
    assert "has no such section" in list_figures.quote_problems()[0]


def test_a_figure_with_two_values_is_found(site: Path) -> None:
    (site / "README.md").write_text("The cold build of the extension took 26 min on two cores.\n")
    (site / "docs" / "install.md").write_text("The cold build of the extension took 12 min on two cores.\n")
    everything = [f for page in list_figures.pages() for f in list_figures.figures(page)]
    (problem,) = list_figures.label_problems(everything)
    assert "'min: cold build extension took' has 2 values" in problem
    # Figures in code are commands, not statements.
    (site / "docs" / "install.md").write_text("```bash\nsleep 12 s\n```\nand `12 min` in code\n")
    everything = [f for page in list_figures.pages() for f in list_figures.figures(page)]
    assert list_figures.label_problems(everything) == []
