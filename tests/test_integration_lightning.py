"""lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2) over
shardstream.integrations.lightning under torchrun (gloo): a worker process SIGKILLed mid-epoch,
the job resumed from the last checkpoint continues with the uninterrupted run's keys, with no
warning that the loader is not resumable."""

from __future__ import annotations

import pytest
from integration_support import key_log, launch, photo_dataset, reference_keys

pytest.importorskip("lightning")

STEPS = 5  # 40 samples, 2 ranks x batch 4: 5 steps per epoch; a checkpoint every 2 steps
KILL_AT = 3  # rank 1 dies as step 4 begins, after the checkpoint of step 2


def test_resume_after_a_killed_worker_continues_with_the_uninterrupted_keys(tmp_path):
    shards, index, keys = photo_dataset(tmp_path / "data")

    def run(name, *extra):
        args = ["--shards", shards, "--index", index, "--keys-dir", str(tmp_path / name), *extra]
        return launch("lightning_worker.py", args, nproc=2)

    # The uninterrupted run's keys: the loader's order is a pure function of seed, epoch and world
    # size; the killed run's first steps are checked against them too.
    full = reference_keys(shards, index, world=2, epochs=2)
    killed = run("killed", "--ckpt-dir", str(tmp_path / "ckpt"), "--kill-at", str(KILL_AT))
    assert killed.returncode != 0, "rank 1 was killed"
    last = tmp_path / "ckpt" / "last.ckpt"
    assert last.is_file()
    resumed = run("resumed", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt", str(last))
    assert resumed.returncode == 0, f"{resumed.stdout[-3000:]}\n{resumed.stderr[-6000:]}"
    assert "not resumable" not in resumed.stderr
    for rank in range(2):
        uninterrupted = full[rank]
        assert len(uninterrupted) == 2 * STEPS
        assert key_log(tmp_path / "killed", rank)[:KILL_AT] == uninterrupted[:KILL_AT]
        assert key_log(tmp_path / "resumed", rank) == uninterrupted[2:], f"rank {rank}: from step 3 on"
    epoch0 = [k for rank in range(2) for b in full[rank][:STEPS] for k in b]
    assert sorted(epoch0) == sorted(keys)
