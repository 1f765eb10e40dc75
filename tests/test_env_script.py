"""scripts/env.sh keeps its caller's shell options: a strict caller (scripts/test.sh, which CI
runs) stays strict after sourcing it, so a failing lint, docs or cargo step stops the suite; an
interactive shell stays lenient.

Sourcing the whole of env.sh here would rebuild the extension under the running tests (maturin
rewrites the loaded module in place), so the test runs env.sh's own lines that save and restore
the options (everything before its first `set -euo pipefail`, and its last two lines) around
strict mode, in a fresh bash each time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ENV_SH = Path(__file__).resolve().parent.parent / "scripts" / "env.sh"


def option_lines() -> tuple[str, str]:
    """env.sh's lines before its strict mode (saving the caller's options) and its last two
    lines (restoring them)."""
    lines = ENV_SH.read_text().splitlines()
    strict = lines.index("set -euo pipefail")
    save = "\n".join(line for line in lines[:strict] if not line.startswith("#"))
    restore = "\n".join(lines[-2:])
    assert lines[-2].startswith("eval "), restore
    return save, restore


def options_after(caller: str) -> str:
    save, restore = option_lines()
    script = "\n".join(
        [
            caller,
            save,
            "set -euo pipefail",
            restore,
            'for o in errexit nounset pipefail; do [[ -o $o ]] && echo -n "$o "; done; true',
        ]
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("set -euo pipefail", "errexit nounset pipefail"),
        ("set -e", "errexit"),
        ("set -o pipefail", "pipefail"),
        ("true", ""),
    ],
)
def test_sourcing_env_sh_keeps_the_callers_options(caller: str, expected: str) -> None:
    assert options_after(caller) == expected


def test_the_test_command_is_strict_when_it_sources_env_sh() -> None:
    test_sh = (ENV_SH.parent / "test.sh").read_text().splitlines()
    strict = test_sh.index("set -euo pipefail")
    assert strict < test_sh.index("source scripts/env.sh")
