"""Every code block of README.md and docs/ is executed here, or marked not runnable with a reason
(the rules are in tests/docs_blocks.py). A page's blocks run in order in one scratch folder, each
in its own process with a time limit, under the Python that runs the tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs_blocks import (
    NOT_CODE,
    PARSED,
    ROOT,
    RUNNABLE,
    Block,
    DocsError,
    docs_files,
    page_blocks,
    parse_blocks,
)

BLOCK_TIMEOUT_S = 120
PAGES = docs_files()


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _run(block: Block, folder: Path, number: int) -> subprocess.CompletedProcess[str]:
    if block.language == "python":
        script = folder / f".block-{number}.py"
        command = [sys.executable, str(script)]
    else:
        script = folder / f".block-{number}.sh"
        command = ["bash", "-euo", "pipefail", str(script)]
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ)
    # The package under test, however pytest found it (an installed build or PYTHONPATH).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python"), env.get("PYTHONPATH")) if p)
    # A bash block calls the `shardstream` command of the Python that runs the tests.
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    # Own session, so that a block's children (torch threads, a CLI) are stopped with it.
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{block.path}:{block.line}: still running after {BLOCK_TIMEOUT_S} s\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, output, "")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_block_is_run_or_marked_with_a_reason(page: Path) -> None:
    for block in page_blocks(page):
        where = f"{block.path}:{block.line}"
        if block.not_run is not None:
            assert block.not_run, f"{where}: a not-run marker needs a reason: <!-- not-run: WHY -->"
            continue
        assert block.language in RUNNABLE + PARSED + NOT_CODE, (
            f"{where}: a {block.language} block is neither run nor parsed here; "
            "mark it <!-- not-run: WHY --> or make it python/bash"
        )


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    ran = 0
    for number, block in enumerate(page_blocks(page)):
        where = f"{block.path}:{block.line}"
        if block.not_run is not None or block.language in NOT_CODE:
            continue
        if block.language == "json":
            json.loads(block.code)
        elif block.language == "yaml":
            yaml.safe_load(block.code)
        else:
            result = _run(block, tmp_path, number)
            assert result.returncode == 0, (
                f"{where}: exit status {result.returncode}\n{result.stdout[-4000:]}"
            )
            ran += 1
    if page.name == "README.md":
        # The quickstart is the README's promise: its write, index and load steps must run here.
        assert ran >= 3, f"README.md: only {ran} blocks ran"


def test_readme_quickstart_prints_batches(tmp_path: Path) -> None:
    """The quickstart does what it says: two epochs of 64-image batches at 224 px from 300
    samples, the 44 samples short of a batch reported as the epoch's remainder."""
    blocks = [b for b in page_blocks(ROOT / "README.md") if b.not_run is None and b.language in RUNNABLE]
    output = ""
    for number, block in enumerate(blocks):
        result = _run(block, tmp_path, number)
        assert result.returncode == 0, result.stdout[-4000:]
        if "loader.set_epoch(epoch)" in block.code:  # the quickstart's loop (other kinds follow it)
            output = result.stdout
    batch_lines = [
        line for line in output.splitlines() if "torch.Size([64, 3, 224, 224]) torch.uint8" in line
    ]
    assert len(batch_lines) == 2 * (300 // 64), output
    assert {line.split()[0] for line in batch_lines} == {"0", "1"}, output
    assert "44 in the epoch's remainder, which no rank yields" in output, output


def _lines(text: str) -> list[tuple[str, str, int]]:
    return [(line, "page.md", number) for number, line in enumerate(text.splitlines(), 1)]


def test_collector_reads_markers_and_refuses_bad_ones() -> None:
    page = "<!-- not-run: needs S3 -->\n\n```bash\naws s3 ls\n```\n\n```python\nprint(1)\n```\n"
    marked, plain = parse_blocks(_lines(page))
    assert (marked.not_run, marked.language, marked.code, marked.line) == (
        "needs S3",
        "bash",
        "aws s3 ls\n",
        3,
    )
    assert (plain.not_run, plain.language, plain.code) == (None, "python", "print(1)\n")
    # A marker without a reason is read as "" and refused by the rule test above.
    (empty,) = parse_blocks(_lines("<!-- not-run: -->\n```bash\ntrue\n```\n"))
    assert empty.not_run == ""
    with pytest.raises(DocsError, match="page.md:1: a not-run marker with no code block"):
        parse_blocks(_lines("<!-- not-run: stray -->\nSome prose.\n```bash\ntrue\n```\n"))
    with pytest.raises(DocsError, match="page.md:1: a code fence without a language"):
        parse_blocks(_lines("```\nplain\n```\n"))
    with pytest.raises(DocsError, match="never closed"):
        parse_blocks(_lines("```python\nprint(1)\n"))


def test_a_failing_block_fails_its_page(tmp_path: Path) -> None:
    (block,) = parse_blocks(_lines("```python\nraise SystemExit(3)\n```\n"))
    assert _run(block, tmp_path, 0).returncode == 3
    (block,) = parse_blocks(_lines("```bash\nfalse\necho never\n```\n"))
    result = _run(block, tmp_path, 1)
    assert result.returncode == 1 and "never" not in result.stdout
