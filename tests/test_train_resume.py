"""`--resume latest` continues mid-epoch at the exact next batch: a run stopped after step 5 and
resumed gives the same sample keys and the same losses, step for step, as an uninterrupted run
(2 ranks under torchrun, gloo, fp32, gradient accumulation 2, across an epoch boundary). Resumed
on one rank instead, the rest of the interrupted epoch is re-planned: nothing lost, nothing twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from train_support import build_small_dataset, read_log, small_config_args, torchrun


def steps(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if r["type"] == "step"}


@pytest.mark.slow
def test_resumed_run_matches_uninterrupted_run(tmp_path: Path) -> None:
    data = build_small_dataset(tmp_path / "data")  # 128 training samples
    common = [
        "--data.heldout", "", "--eval.zeroshot", "",
        "--train.accum_steps", "2", "--train.epochs", "3",  # 128 / (8 x 2 ranks x 2) = 4 steps per epoch
        "--log.log_keys", "true", "--checkpoint.every_steps", "0",
    ]  # fmt: skip

    whole = tmp_path / "whole"
    run = torchrun(small_config_args(data, whole, *common), timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr

    parts = tmp_path / "parts"
    first = torchrun(small_config_args(data, parts, *common, "--train.stop_at_step", "5"), timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "training stopped early at step 5" in first.stdout
    elastic = tmp_path / "elastic"
    shutil.copytree(parts, elastic)
    second = torchrun(small_config_args(data, parts, *common, "--resume", "latest"), timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from" in second.stdout and "at step 5 (epoch 1, step 1 in it)" in second.stdout

    expected = steps(read_log(whole))
    got = steps(read_log(parts))  # both runs append to the same log.jsonl
    assert sorted(expected) == list(range(1, 13))
    assert sorted(got) == sorted(expected)
    for step, record in expected.items():
        assert got[step]["keys"] == record["keys"], f"step {step}: different samples after resume"
        assert got[step]["epoch"] == record["epoch"]
        assert got[step]["lr"] == record["lr"]
        # same ops, same order, same thread count: the losses are bit-identical, not just close
        assert got[step]["loss"] == record["loss"], f"step {step}"
    # every sample of an epoch once on rank 0's side: 4 steps x 2 micro-batches x 8 = 64 distinct keys
    epoch1 = [k for s in (5, 6, 7, 8) for k in got[s]["keys"]]
    assert len(epoch1) == len(set(epoch1)) == 64
    # each complete epoch reports the loader's counters summed over ranks: all 128 samples, none lost
    epochs = [r for r in read_log(whole) if r["type"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert all(e["samples"] == 128 and e["skipped_total"] == 0 and e["remainder"] == 0 for e in epochs)

    # the same checkpoint resumed on 1 rank: epoch 1 had 1 step x 32 samples done on 2 ranks; the
    # remaining 96 are re-planned for one rank (6 steps of 2 x 8), then epoch 2 takes 8 steps
    one = torchrun(small_config_args(data, elastic, *common, "--resume", "latest"), nproc=1, timeout=240)
    assert one.returncode == 0, one.stdout + one.stderr
    assert "checkpoint from 2 ranks onto 1" in one.stdout
    records = read_log(elastic)
    resumed = [r for r in records if r["type"] == "step" and r["step"] > 5]
    assert [r["step"] for r in resumed] == list(range(6, 20))
    assert [r["epoch"] for r in resumed] == [1] * 6 + [2] * 8
    epoch_records = [r for r in records if r["type"] == "epoch"]
    assert [(e["epoch"], e["samples"]) for e in epoch_records] == [(0, 128), (1, 96), (2, 128)]
    rest_of_epoch1 = [k for r in resumed[:6] for k in r["keys"]]
    assert len(set(rest_of_epoch1)) == 96
    assert not set(rest_of_epoch1) & set(got[5]["keys"])  # rank 0's part of step 5 is not read again
