"""The docs' pictures are drawn from real loader output by scripts/draw_pictures.py: it still
runs against the current API and writes every PNG the pages show."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_pictures_still_build(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import draw_pictures
    finally:
        sys.path.pop(0)
    from PIL import Image

    assert draw_pictures.main(["--out", str(tmp_path)]) == 0
    for name in draw_pictures.NAMES:
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width > 500 and image.height > 200, name
        # Each picture is checked in and shown by a page.
        assert (ROOT / "docs" / name).is_file(), name
        shown = [
            p for p in (ROOT / "docs").rglob("*.md") if re.search(rf"\]\((\.\./)*{name}\)", p.read_text())
        ]
        assert shown, f"no page shows {name}"
