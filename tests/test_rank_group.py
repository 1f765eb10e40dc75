"""``_rank_group.RankGroup`` inside a script that already initialised torch.distributed: it
reuses a plain gloo default group and otherwise (NCCL in a training script, which cannot move
the CPU tensors it sends) makes its own gloo subgroup. Real torchrun, 2 ranks, gloo on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shardstream._rank_group import needs_gloo_subgroup
from train_support import torchrun

WORKER = str(Path(__file__).with_name("rank_group_worker.py"))


@pytest.mark.parametrize(
    ("backend", "subgroup"),
    [("gloo", False), ("nccl", True), ("cpu:gloo,cuda:nccl", True), ("mpi", True), ("xccl", True)],
)
def test_only_a_plain_gloo_default_group_is_reused(backend: str, subgroup: bool) -> None:
    assert needs_gloo_subgroup(backend) is subgroup


def run_worker(backend: str, out: Path) -> list[dict]:
    run = torchrun(["--backend", backend, "--out", str(out)], script=WORKER, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo"])
def test_gathers_through_a_group_the_caller_initialised(tmp_path: Path, backend: str) -> None:
    ranks = run_worker(backend, tmp_path)
    expected_gather = [{"rank": 0, "text": ""}, {"rank": 1, "text": "x"}]
    assert ranks[0]["gathered"] == expected_gather and ranks[1]["gathered"] is None
    for record in ranks:
        assert record["default_backend"] == backend
        assert record["group_backend"] == "gloo"
        assert record["broadcast"] == {"from": 0, "shards": [0, 1, 2]}
        assert record["all_reduce_after"] == 3  # the caller's group still works after the block
