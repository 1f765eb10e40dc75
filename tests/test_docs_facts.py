"""One statement per fact (issue 42): a measured figure lives on docs/performance.md with its
command and spread, and other pages quote it from there. scripts/list_figures.py lists the
figures stated on two or more pages and finds the two ways a fact stated twice drifts: a quote
that no longer matches the performance section it links to, and the same labelled figure with
different values on two pages or two paragraphs of one. It also checks every default the docs
state for a public keyword against the code's signature (issue 55)."""

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


def test_a_figure_with_two_values_on_one_page_is_found(site: Path) -> None:
    """Issue 55: one page gave a rank's 16-thread rate twice, with two values; a target beside a
    measured figure is not a second value of it."""
    page = site / "docs" / "performance.md"
    page.write_text(
        "# Performance\n\nOn the GPU node a single rank decoded 8,789 samples/s.\n\n"
        "Later, on the GPU node a single rank decoded 14,385 samples/s.\n"
    )
    everything = list_figures.figures(page)
    (problem,) = list_figures.label_problems(everything)
    assert "'samples/s: node single rank decoded' has 2 values" in problem
    page.write_text(
        "# Performance\n\nOn the GPU node a single rank decoded 8,789 samples/s.\n\n"
        "The target: on the GPU node a single rank decoded 10,000 samples/s.\n"
    )
    assert list_figures.label_problems(list_figures.figures(page)) == []


def test_no_stated_default_differs_from_the_code() -> None:
    assert list_figures.default_problems() == []


def test_a_stated_default_that_is_not_the_code_s_is_found(site: Path) -> None:
    """Issue 55's kind of contradiction: a default written on a page that the signature does not
    have. Checked against the real public API."""
    signatures = list_figures.public_signatures()
    assert signatures["ShardLoader"]["random_crop_scale"] == (0.9, 1.0)
    page = site / "docs" / "page.md"
    page.write_text(
        "# Options\n\n## `LoaderConfig`\n\n"
        "- `random_crop_scale`: the crop's area (default `(0.8, 1.0)`).\n"
        "- `prefetch`: batches made ahead (default 2).\n\n"
        "## Prose\n\nA larger `shuffle_buffer` (default 2048) mixes more; `max_member_bytes` is\n"
        "256 MiB by default, and `max_pixels` 64 M by default.\n"
        "`max_images_per_batch` (default: 4 x `max_patches_per_batch`) is a formula, not read.\n"
    )
    problems = list_figures.default_problems(signatures)
    assert len(problems) == 2, problems
    # In the section documenting LoaderConfig, NaFlex's (0.8, 1.0) is not LoaderConfig's.
    assert problems[0].startswith("docs/page.md:5: `random_crop_scale` default '`(0.8, 1.0)`'")
    assert "LoaderConfig: (0.9, 1.0)" in problems[0]
    # Outside a documented object, a keyword's default must be one it has somewhere.
    assert problems[1].startswith("docs/page.md:10: `shuffle_buffer` default '2048'")


def test_the_classifiers_name_the_platforms_the_release_builds() -> None:
    """Issue 55: pyproject declared macOS and not Windows, while the release builds both."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        classifiers = tomllib.load(f)["project"]["classifiers"]
    declared = {c.split(" :: ")[1] for c in classifiers if c.startswith("Operating System ::")}
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text(encoding="utf-8")
    built = {
        name
        for job, name in (("linux", "POSIX"), ("macos", "MacOS"), ("windows", "Microsoft"))
        if f"\n  {job}:\n" in release
    }
    assert declared == built, (declared, built)
