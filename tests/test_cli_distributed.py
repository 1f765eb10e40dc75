"""`shardstream validate` as a distributed job under a real torchrun (2 ranks, gloo, loopback):
each rank scans its share, rank 0 writes the merged report, identical to a one-process run."""

from __future__ import annotations

import json
import os

import pytest
import shardstream
from cli_runs import torchrun
from corpus import build_corrupt_corpus, good_shard
from shardstream.cli import main


def without_timing(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("elapsed_s", "world_size")}


@pytest.mark.slow
def test_two_ranks_give_the_same_report_as_one_process(tmp_path, capsys):
    directory = tmp_path / "corpus"
    expected = build_corrupt_corpus(str(directory))
    paths = [str(directory / name) for name in sorted(expected)]
    options = ["--max-member-bytes", "1MiB"]

    assert main(["validate", *paths, *options, "--json", str(tmp_path / "single.json")]) == 1
    capsys.readouterr()
    run = torchrun(["validate", *paths, *options, "--json", str(tmp_path / "merged.json"), "--threads", "1"])
    assert run.returncode != 0, run.stdout + run.stderr  # torchrun reports the ranks' status 1 as failure
    merged = json.loads((tmp_path / "merged.json").read_text())
    single = json.loads((tmp_path / "single.json").read_text())
    assert merged["world_size"] == 2
    assert without_timing(merged) == without_timing(single)
    # Only rank 0 prints the summary; both ranks exit with the merged status 1, none crashed.
    assert run.stdout.count("result: INVALID samples found (exit status 1)") == 1
    # torchrun prints its own ChildFailedError traceback; none may come from our code.
    assert os.path.dirname(shardstream.__file__) not in run.stderr
    assert "exitcode  : 1" in run.stderr and "exitcode  : 2" not in run.stderr


@pytest.mark.slow
def test_two_ranks_on_clean_shards_exit_0(tmp_path):
    paths = [good_shard(str(tmp_path / f"shard-{i}.tar"), 3, seed=i) for i in range(5)]
    run = torchrun(["validate", *paths, "--json", str(tmp_path / "r.json")])
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [s["url"] for s in report["shards"]] == paths
    assert report["totals"]["samples"] == 15 and report["world_size"] == 2
    assert run.stdout.count("result: all samples valid (exit status 0)") == 1


@pytest.mark.slow
def test_more_ranks_than_shards(tmp_path):
    path = good_shard(str(tmp_path / "only.tar"), 2)
    run = torchrun(["validate", path, "--json", str(tmp_path / "r.json")])
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "r.json").read_text())["totals"]["samples"] == 2


def test_no_distributed_ignores_the_environment(tmp_path, capsys, monkeypatch):
    path = good_shard(str(tmp_path / "s.tar"), 2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["validate", path, "--no-distributed"]) == 0
    monkeypatch.setenv("RANK", "5")
    assert main(["validate", path]) == 2
    assert "RANK=5 is not in range for WORLD_SIZE=2" in capsys.readouterr().err
