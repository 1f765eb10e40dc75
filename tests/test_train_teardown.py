"""The end of a run under real torchrun (2 ranks, gloo) exits with status 0, every time.

2 of 7 two-rank runs used to finish training, write the final checkpoint, and then abort on rank 1
("terminate called without an active exception", SIGABRT; torchrun exit status 1): a scheduler
marks such a run failed, and ``--max-restarts`` restarts a finished job. Rank 1 left while rank 0
was still writing the checkpoint, and its interpreter finalized beside the gloo threads of the
process group that DistributedDataParallel keeps alive after ``destroy_process_group``. The ranks
now leave together (a barrier) and a finished worker ends without interpreter finalization.

It is the process exit that crashed, so each of the ends is a torchrun launch of its own; two
run at a time (the contention only makes a late thread likelier)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shardstream.train.config import ConfigError
from shardstream.train.dist import local_cuda_index
from train_support import build_small_dataset, read_log, small_config_args, torchrun

ENDS = 10
STEPS = 2


@pytest.mark.slow
@pytest.mark.timeout(480)  # ten torchrun launches, two at a time
def test_every_end_of_training_exits_with_status_0(tmp_path: Path) -> None:
    data = build_small_dataset(tmp_path / "data")

    def end_of_training(attempt: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
        out = tmp_path / f"run-{attempt}"
        # the demo's ending: the final evaluation, the final checkpoint, TensorBoard's writer
        args = small_config_args(data, out, "--train.max_steps", str(STEPS), "--log.tensorboard", "true")
        return out, torchrun(args, timeout=180)

    with ThreadPoolExecutor(max_workers=2) as pool:
        ends = list(pool.map(end_of_training, range(ENDS)))

    failed = [(out.name, run) for out, run in ends if run.returncode != 0]
    if failed:
        name, run = failed[0]
        pytest.fail(
            f"{len(failed)} of {ENDS} ends failed; {name}: exit status {run.returncode}\n"
            f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
        )
    for out, run in ends:
        assert "terminate called" not in run.stderr
        assert f"training finished at step {STEPS}" in run.stdout
        assert (out / "checkpoints" / f"step-{STEPS:08d}.pt").is_file()
        records = read_log(out)
        assert [r["type"] for r in records][-3:] == ["eval", "checkpoint", "end"]


def test_the_cuda_device_is_0_where_a_launcher_gives_each_process_one_gpu() -> None:
    assert [local_cuda_index(rank, 1) for rank in range(4)] == [0, 0, 0, 0]  # CUDA_VISIBLE_DEVICES=k
    assert [local_cuda_index(rank, 4) for rank in range(4)] == [0, 1, 2, 3]  # every GPU of the node
    with pytest.raises(ConfigError, match="LOCAL_RANK 2 has no CUDA device: this process sees 2"):
        local_cuda_index(2, 2)
