"""Progress lines: rate and ETA on a real terminal (a pseudo-terminal), nothing in pipes or CI."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from cli_runs import run_on_pty as _run_on_pty
from corpus import good_shard
from shardstream.progress import Progress, human_bytes, human_duration, progress_wanted


def test_status_line_has_counts_rates_and_eta():
    p = Progress("validate", total=10, enabled=False)
    p._start -= 2.0  # two seconds ago, so the rates are predictable
    p.advance(4, samples=400, nbytes=8_000_000)
    line = p.line()
    assert line.startswith("validate  4/10 shards  400 samples (")
    assert "8.0 MB (" in line and "MB/s)" in line
    assert "ETA 0:00:03" in line


def test_formatting_helpers():
    assert human_bytes(999) == "999 B"
    assert human_bytes(1_500_000) == "1.5 MB"
    assert human_bytes(2.5e12) == "2.5 TB"
    assert human_duration(3725) == "1:02:05"


def test_disabled_for_pipes_and_ci(monkeypatch):
    stream = io.StringIO()
    assert not progress_wanted(stream)
    p = Progress("x", total=3, stream=stream)
    p.advance(3)
    p.close()
    assert stream.getvalue() == ""
    # a real terminal, but CI says no
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            monkeypatch.delenv("CI", raising=False)
            monkeypatch.delenv("SHARDSTREAM_NO_PROGRESS", raising=False)
            monkeypatch.setenv("TERM", "xterm")
            assert progress_wanted(tty)
            monkeypatch.setenv("CI", "true")
            assert not progress_wanted(tty)
    finally:
        os.close(master)
        os.close(slave)


def test_validate_draws_progress_on_a_terminal_and_not_in_a_pipe(tmp_path):
    shards = [good_shard(str(tmp_path / f"{i}.tar"), 3, seed=i) for i in range(4)]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SHARDSTREAM_NO_PROGRESS")}
    env["TERM"] = "xterm"
    argv = [sys.executable, "-m", "shardstream", "validate", *shards, "--threads", "1"]
    status, output = _run_on_pty(argv, env)
    assert status == 0, output
    assert b"\rvalidate  " in output and b"4/4 shards" in output
    piped = subprocess.run(argv, capture_output=True, env=env, timeout=60)
    assert piped.returncode == 0
    assert b"\r" not in piped.stdout + piped.stderr and b"ETA" not in piped.stdout + piped.stderr
    assert b"result: all samples valid (exit status 0)" in piped.stdout


def test_a_count_pass_draws_progress_on_a_terminal_and_counts_the_same(tmp_path):
    """count_tokens (as count_patches and count_interleaved: one counting driver) shows files,
    units, bytes, rate and ETA on a terminal, ends with a summary line, and counts exactly what it
    counts in a pipe, where it stays quiet (issue 55)."""
    from text_corpus import GPT2_STYLE, documents, write_parquet_corpus

    files = write_parquet_corpus(str(tmp_path), documents(20)[:400], files=12)
    script = (
        "import json, sys; from shardstream import count_tokens; "
        f"c = count_tokens({files!r}, tokenizer={GPT2_STYLE!r}, threads=1); "
        "print(json.dumps([(u['url'], u['tokens']) for u in c.units]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SHARDSTREAM_NO_PROGRESS")}
    env["TERM"] = "xterm"
    status, output = _run_on_pty([sys.executable, "-c", script], env)
    assert status == 0, output
    assert b"\rcount_tokens  " in output and b"/12 files" in output and b"units (" in output
    assert b"12/12 files" in output and b"kB" in output, "the summary: every file, and the bytes read"
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=120)
    assert piped.returncode == 0 and b"\r" not in piped.stdout + piped.stderr
    on_terminal = output.rsplit(b"\n", 2)[-2].strip()
    assert on_terminal.decode() == piped.stdout.decode().strip(), "the same counts either way"


def test_subset_draws_progress_on_a_terminal(tmp_path):
    from shardstream import read_samples
    from shardstream.index import build_index, write_index

    shards = [good_shard(str(tmp_path / f"{i}.tar"), 3, seed=i) for i in range(4)]
    index = write_index(build_index(shards), str(tmp_path / "pool.index"))
    keys = sorted({s["__key__"] for s in read_samples(shards[:1])})[:1]  # one key, in every shard
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SHARDSTREAM_NO_PROGRESS")}
    env["TERM"] = "xterm"
    argv = [sys.executable, "-m", "shardstream", "subset", index, "--keys", str(tmp_path / "keys.txt")]
    status, output = _run_on_pty([*argv, "-o", str(tmp_path / "a.index")], env)
    assert status == 0, output
    assert b"\rsubset  " in output and b"4/4 shards" in output and b"4 samples kept" in output
    piped = subprocess.run([*argv, "-o", str(tmp_path / "b.index")], capture_output=True, env=env, timeout=60)
    assert piped.returncode == 0 and b"\r" not in piped.stdout + piped.stderr
