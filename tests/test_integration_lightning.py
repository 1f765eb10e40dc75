"""lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2) over
shardstream.integrations.lightning under torchrun (gloo): a worker process SIGKILLed mid-epoch,
the job resumed from the last checkpoint continues with the uninterrupted run's keys, with no
warning that the loader is not resumable; resumed on 1 rank instead, the rest of the epoch is
re-planned: no sample twice, each sample once over the epoch."""

from __future__ import annotations

import shutil

import pytest
from integration_support import REPETITIONS, key_log, launch, photo_dataset, reference_keys, repetition_id

pytest.importorskip("lightning")

STEPS = 5  # 40 samples, 2 ranks x batch 4: 5 steps per epoch; a checkpoint every 2 steps
KILL_AT = 3  # rank 1 dies as step 4 begins, after the checkpoint of step 2


def run(root, name, *extra, nproc=2):
    shards, index = root["shards"], root["index"]
    args = ["--shards", shards, "--index", index, "--keys-dir", str(root["dir"] / name), *extra]
    return launch("lightning_worker.py", args, nproc=nproc)


@pytest.fixture(scope="module", params=REPETITIONS, ids=repetition_id)
def killed(tmp_path_factory, request):
    """A 2-rank run whose rank 1 was SIGKILLed after the checkpoint of step 2, and a copy of that
    checkpoint folder for the 1-rank resume (the 2-rank resume writes into the first)."""
    directory = tmp_path_factory.mktemp(f"lightning-rep{request.param}")
    shards, index, keys = photo_dataset(directory / "data")
    root = {"dir": directory, "shards": shards, "index": index, "keys": keys}
    result = run(root, "killed", "--ckpt-dir", str(directory / "ckpt"), "--kill-at", str(KILL_AT))
    assert result.returncode != 0, "rank 1 was killed"
    assert (directory / "ckpt" / "last.ckpt").is_file()
    shutil.copytree(directory / "ckpt", directory / "ckpt-elastic")
    return root


def test_resume_after_a_killed_worker_continues_with_the_uninterrupted_keys(killed):
    directory, keys = killed["dir"], killed["keys"]
    # The uninterrupted run's keys: the loader's order is a pure function of seed, epoch and world
    # size; the killed run's first steps are checked against them too.
    full = reference_keys(killed["shards"], killed["index"], world=2, epochs=2)
    last = directory / "ckpt" / "last.ckpt"
    resumed = run(killed, "resumed", "--ckpt-dir", str(directory / "ckpt"), "--ckpt", str(last))
    assert resumed.returncode == 0, f"{resumed.stdout[-3000:]}\n{resumed.stderr[-6000:]}"
    assert "not resumable" not in resumed.stderr
    for rank in range(2):
        uninterrupted = full[rank]
        assert len(uninterrupted) == 2 * STEPS
        assert key_log(directory / "killed", rank)[:KILL_AT] == uninterrupted[:KILL_AT]
        assert key_log(directory / "resumed", rank) == uninterrupted[2:], f"rank {rank}: from step 3 on"
    epoch0 = [k for rank in range(2) for b in full[rank][:STEPS] for k in b]
    assert sorted(epoch0) == sorted(keys)


def test_resume_on_one_rank_reads_the_rest_of_the_epoch_once(killed):
    directory, keys = killed["dir"], killed["keys"]
    last = directory / "ckpt-elastic" / "last.ckpt"
    elastic = run(
        killed, "elastic", "--ckpt-dir", str(directory / "ckpt-elastic"), "--ckpt", str(last),
        "--devices", "1", "--max-epochs", "1", nproc=1,
    )  # fmt: skip
    assert elastic.returncode == 0, f"{elastic.stdout[-3000:]}\n{elastic.stderr[-6000:]}"
    # The checkpoint is that of step 2: 2 steps x 2 ranks x 4 samples trained before it.
    full = reference_keys(killed["shards"], killed["index"], world=2, epochs=1)
    before = [k for rank in range(2) for b in full[rank][:2] for k in b]
    after = [k for b in key_log(directory / "elastic", 0) for k in b]
    assert len(after) == len(keys) - len(before) == 24, "the one rank reads the rest of the epoch"
    assert len(set(after)) == len(after) and not set(after) & set(before), "no sample read twice"
    assert sorted(before + after) == sorted(keys), "each sample once over the epoch"
