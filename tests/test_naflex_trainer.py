"""SigLIP 2 NaFlex through transformers.Trainer (ShardTrainer and Siglip2Collator) on 2 CPU ranks
under torchrun (gloo): a tiny Siglip2Model from a config (nothing downloaded) trains on NaFlex
batches of real-photo shards. Its loss falls and logit_bias moves; stopped at step n with a
checkpoint, resume_from_checkpoint trains on exactly the uninterrupted run's samples from n+1. The
same with token-budget batches (NaFlexBudgetLoader: as many images as fit 64 patches)."""

from __future__ import annotations

import json

import pytest
from integration_support import key_log, launch, photo_dataset
from naflex_trainer_worker import budget_loader, count_budget, naflex_loader

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STOP, STEPS = 2, 5  # 40 samples, 2 ranks x batch 4: 5 steps per epoch


@pytest.fixture(scope="module", params=["fixed-count", "token-budget"])
def runs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("naflex-trainer")
    shards, index, keys = photo_dataset(root / "data")
    budget = request.param == "token-budget"
    counts = str(root / "patch-counts.json")
    if budget:
        count_budget(shards, counts)
        assert len(budget_loader(shards, counts, rank=0, world=2)) >= STEPS

    def train(name, *, max_steps, resume=None):
        args = [
            "--shards", shards, "--index", index, "--output-dir", str(root / name / "out"),
            "--keys-dir", str(root / name / "keys"), "--max-steps", str(max_steps), "--save-steps", str(STOP),
        ]  # fmt: skip
        if budget:
            args += ["--budget-counts", counts]
        if resume is not None:
            args += ["--resume", str(resume)]
        run = launch("naflex_trainer_worker.py", args, nproc=2, timeout=300)
        assert run.returncode == 0, f"{name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        return root / name

    def reference(rank):
        if budget:
            return budget_loader(shards, counts, rank=rank, world=2)
        return naflex_loader(shards, index, rank=rank, world=2)

    full = [[list(b.keys) for b in reference(r)] for r in range(2)]
    uninterrupted = train("full", max_steps=STEPS)
    stopped = train("stopped", max_steps=STOP)
    resumed = train("resumed", max_steps=STEPS, resume=stopped / "out" / f"checkpoint-{STOP}")
    return {
        "full": full,
        "uninterrupted": uninterrupted,
        "stopped": stopped,
        "resumed": resumed,
        "keys": keys,
    }


def test_the_loss_falls_and_logit_bias_moves(runs):
    with open(runs["uninterrupted"] / "keys" / "loss.jsonl", encoding="utf-8") as f:
        log = [json.loads(line) for line in f]
    assert len(log) == STEPS
    assert log[-1]["loss"] < log[0]["loss"], log
    assert log[-1]["logit_bias"] != log[0]["logit_bias"]


def test_resume_from_checkpoint_trains_on_the_uninterrupted_samples(runs):
    for rank in range(2):
        full = runs["full"][rank]
        assert key_log(runs["uninterrupted"] / "keys", rank) == full[:STEPS]
        assert key_log(runs["stopped"] / "keys", rank) == full[:STOP]
        assert key_log(runs["resumed"] / "keys", rank) == full[STOP:STEPS], f"rank {rank}"
