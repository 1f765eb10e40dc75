"""A plain accelerate loop through shardstream.integrations.accelerate, 2 CPU processes under
``accelerate launch`` (gloo): save_state after n steps, then a new run's load_state continues
with the uninterrupted run's keys, and its next epoch is the uninterrupted run's next epoch."""

from __future__ import annotations

import pytest
from integration_support import REPETITIONS, key_log, launch, photo_dataset, repetition_id

pytest.importorskip("accelerate")

SAVE_AT, STEPS = 2, 5  # 40 samples, 2 ranks x batch 4: 5 steps per epoch


@pytest.mark.parametrize("repetition", REPETITIONS, ids=repetition_id)
def test_load_state_continues_with_the_uninterrupted_keys(tmp_path, repetition):
    shards, index, keys = photo_dataset(tmp_path / "data")
    common = ["--shards", shards, "--index", index, "--state-dir", str(tmp_path / "state")]

    def run(name, *extra):
        args = [*common, "--keys-dir", str(tmp_path / name), *extra]
        result = launch("accelerate_worker.py", args, nproc=2, launcher="accelerate")
        assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        return [key_log(tmp_path / name, r) for r in range(2)]

    full = run("full", "--save-at", str(SAVE_AT))
    assert (tmp_path / "state" / "custom_checkpoint_0.pkl").is_file()
    resumed = run("resumed", "--load")
    for rank in range(2):
        assert len(full[rank]) == 2 * STEPS
        assert resumed[rank] == full[rank][SAVE_AT:], f"rank {rank}: the rest of epoch 0, then epoch 1"
    epoch0 = [k for rank in range(2) for b in full[rank][:STEPS] for k in b]
    assert sorted(epoch0) == sorted(keys)
