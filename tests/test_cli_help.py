"""Help, version and usage errors of the `shardstream` command, in-process and as real processes
(the console script and `python -m shardstream`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from shardstream.cli import main, parse_size

VERBS = ("validate", "index", "inspect", "write")


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help_with_examples(verb, capsys):
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardstream {verb}")
    assert "examples:" in out and f"shardstream {verb} " in out.split("examples:")[1]


def test_top_level_help_lists_the_verbs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in VERBS:
        assert verb in out
    assert "exit status: 0 success, 1 invalid data found, 2 bad usage or unreadable input" in out


def test_version(capsys):
    from shardstream import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"shardstream {__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: VERB"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["validate"], "the following arguments are required: URL"),
        (["validate", "x.tar", "--threads", "0"], "must be >= 1"),
        (["validate", "x.tar", "--require", "caption"], "invalid choice: 'caption'"),
        (["index", "x.tar"], "required: -o/--output"),
        (["inspect", "x.tar", "-n", "many"], "not an integer: 'many'"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000", 1000),
        ("500MB", 500_000_000),
        ("1G", 10**9),
        ("1GiB", 1 << 30),
        ("1.5kB", 1500),
        ("64 MiB", 64 << 20),
    ],
)
def test_sizes(text, value):
    assert parse_size(text) == value


def _console_script() -> str:
    return os.path.join(os.path.dirname(sys.executable), "shardstream")


@pytest.mark.parametrize("launcher", ["script", "module"])
def test_real_processes_print_help_and_exit_codes(launcher):
    cmd = [_console_script()] if launcher == "script" else [sys.executable, "-m", "shardstream"]
    if launcher == "script" and not os.path.exists(cmd[0]):
        pytest.fail(f"console script not installed at {cmd[0]} (run `source scripts/env.sh`)")
    ok = subprocess.run([*cmd, "validate", "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "usage: shardstream validate" in ok.stdout
    bad = subprocess.run([*cmd, "validate"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "required: URL" in bad.stderr
    version = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("shardstream ")
