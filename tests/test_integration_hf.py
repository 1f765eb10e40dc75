"""transformers.Trainer through shardstream.integrations.hf, on 2 CPU ranks under torchrun (gloo):
a tiny CLIPModel (from a config, nothing downloaded) trains on real-photo shards. Stopped at step
n by max_steps with a checkpoint, resume_from_checkpoint continues with the keys of the
uninterrupted run's steps n+1.., no sample read twice; resumed on 1 rank, the epoch is still
exactly once."""

from __future__ import annotations

import shutil

import pytest
from integration_support import REPETITIONS, key_log, launch, photo_dataset, reference_keys, repetition_id

pytest.importorskip("transformers")

STOP, STEPS = 2, 5  # 40 samples, 2 ranks x batch 4: 5 steps per epoch


@pytest.fixture(scope="module", params=REPETITIONS, ids=repetition_id)
def runs(tmp_path_factory, request):
    root = tmp_path_factory.mktemp(f"hf-rep{request.param}")
    shards, index, keys = photo_dataset(root / "data")

    def train(name, *, nproc, max_steps, resume=None):
        args = [
            "--shards", shards, "--index", index, "--output-dir", str(root / name / "out"),
            "--keys-dir", str(root / name / "keys"), "--max-steps", str(max_steps),
            "--save-steps", str(STOP),
        ]  # fmt: skip
        if resume is not None:
            args += ["--resume", str(resume)]
        run = launch("hf_worker.py", args, nproc=nproc)
        assert run.returncode == 0, f"{name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        return root / name

    # The uninterrupted run's keys: the loader's order is a pure function of seed, epoch and world
    # size, and the stopped run is checked against them too (so Trainer adds nothing to it).
    full = reference_keys(shards, index, world=2, epochs=1)
    stopped = train("stopped", nproc=2, max_steps=STOP)
    checkpoint = stopped / "out" / f"checkpoint-{STOP}"
    assert (checkpoint / "shardstream_loader.json").is_file()
    elastic_copy = root / "elastic-checkpoint"
    shutil.copytree(checkpoint, elastic_copy)
    resumed = train("resumed", nproc=2, max_steps=STEPS, resume=checkpoint)
    # On one rank the epoch's steps are the n done on two, then the 40 - 2 x n x 4 samples left.
    elastic = train("elastic", nproc=1, max_steps=STOP + (len(keys) - 2 * STOP * 4) // 4, resume=elastic_copy)
    return {"full": full, "stopped": stopped, "resumed": resumed, "elastic": elastic, "keys": keys}


def test_resume_from_checkpoint_continues_with_the_uninterrupted_keys(runs):
    for rank in range(2):
        full = runs["full"][rank]
        before = key_log(runs["stopped"] / "keys", rank)
        after = key_log(runs["resumed"] / "keys", rank)
        assert len(full) == STEPS
        assert before == full[:STOP], "stopped by max_steps after exactly n steps"
        assert after == full[STOP:], f"rank {rank}: steps n+1.. are those of the uninterrupted run"
    logs = [key_log(runs[name] / "keys", r) for name in ("stopped", "resumed") for r in range(2)]
    seen = [k for log in logs for batch in log for k in batch]
    assert len(seen) == len(set(seen)) == len(runs["keys"]), "each sample read once over stop and resume"


def test_resume_on_one_rank_keeps_the_epoch_exactly_once(runs):
    before = [k for r in range(2) for b in key_log(runs["stopped"] / "keys", r) for k in b]
    after = [k for b in key_log(runs["elastic"] / "keys", 0) for k in b]
    assert len(after) == len(runs["keys"]) - len(before), "the one rank reads the rest of the epoch"
    assert sorted(before + after) == sorted(runs["keys"]), "nothing read twice, nothing lost"
