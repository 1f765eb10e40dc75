"""Which rank of how many a process is, when Slurm's ``srun`` starts it without torchrun (issue 55):
each task of a step reads its own share, the ``sbatch`` script itself stays one process, torchrun's
variables win over Slurm's, and a process group that cannot rendezvous is refused in one line. The
same rule holds for the loaders, the CLI and the trainer (tests/test_train_recipe.py)."""

from __future__ import annotations

import os

import pytest
from corpus import write_shards
from shardstream import ShardLoader
from shardstream._system import LaunchError, default_loader_threads, launch_rank_world, local_world_size
from shardstream.cli import main
from shardstream.index import build_index, write_index

SLURM_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def srun_task(monkeypatch, rank: int, tasks: int, *, per_node: int | None = None) -> None:
    """The variables srun sets for task ``rank`` of a step of ``tasks`` (and none of torchrun's)."""
    for name in SLURM_KEYS:
        monkeypatch.delenv(name, raising=False)
    per_node = tasks if per_node is None else per_node
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": str(tasks),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{tasks // per_node})",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{tasks // per_node})",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    paths, keys = write_shards(root, [9, 8, 7], seed=61)
    return paths, write_index(build_index(paths), str(root / "index")), keys


def test_two_srun_tasks_read_one_epoch_between_them_not_two_copies(indexed, monkeypatch):
    paths, index, keys = indexed
    read = []
    for rank in range(2):
        srun_task(monkeypatch, rank, 2)
        loader = ShardLoader(paths, index=index, batch_size=3, image_size=32, threads=1)
        assert (loader.rank, loader.world_size) == (rank, 2)
        read += [k for b in loader for k in b.keys]
    remainder = loader.stats["remainder_keys"]
    assert len(read) == len(set(read)), "no sample read by both tasks"
    assert sorted(read + remainder) == sorted(keys) and len(remainder) < 2 * 3


def test_the_sbatch_script_itself_is_one_process_whatever_the_allocation(monkeypatch):
    # In the batch script SLURM_NTASKS counts the tasks srun may start, and SLURM_PROCID is 0:
    # taken as rank 0 of 4, a count or index made there would read a quarter of the data.
    srun_task(monkeypatch, 0, 4)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    assert launch_rank_world() == (0, 1) and local_world_size() == 1


def test_torchrun_inside_srun_decides(monkeypatch):
    srun_task(monkeypatch, 1, 2)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert launch_rank_world() == (5, 8) and local_world_size() == 4


def test_decode_threads_are_shared_by_the_tasks_on_a_node(monkeypatch):
    srun_task(monkeypatch, 3, 8, per_node=4)
    cores = len(os.sched_getaffinity(0))
    assert local_world_size() == 4 and default_loader_threads() == max(1, cores // 4)


def test_a_distributed_cli_pass_under_srun_without_an_address_is_one_line(
    indexed, monkeypatch, capsys, tmp_path
):
    paths, _, _ = indexed
    srun_task(monkeypatch, 0, 2)
    assert main(["index", *paths, "-o", str(tmp_path / "i"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 SLURM tasks (srun) without torchrun" in err[0] and "MASTER_ADDR" in err[0]
    assert not (tmp_path / "i").exists()


def test_the_refusal_has_a_kind(monkeypatch):
    from shardstream._system import require_rendezvous

    srun_task(monkeypatch, 0, 2)
    with pytest.raises(LaunchError, match="MASTER_ADDR and MASTER_PORT"):
        require_rendezvous(2)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    require_rendezvous(2)


def _report_threads(worker_id: int) -> None:
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    with open(os.environ["THREADS_REPORT"], "a", encoding="utf-8") as f:
        f.write(f"{worker_id} {info.dataset.owner.threads}\n")


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_dataloader_workers_share_the_ranks_decode_threads(indexed, workers, monkeypatch, tmp_path):
    """``dataloader(K)`` without ``threads=``: the K workers' pipelines run the rank's share of
    the cores between them (each at least one thread), not K times it (issue 55)."""
    paths, index, _ = indexed
    for name in SLURM_KEYS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    report = tmp_path / "threads.txt"
    monkeypatch.setenv("THREADS_REPORT", str(report))
    loader = ShardLoader(paths, index=index, batch_size=3, image_size=32, rank=0, world_size=1)
    share = default_loader_threads()
    assert loader.threads == share, "read in this process: the whole share"
    batches = list(loader.dataloader(workers, worker_init_fn=_report_threads))
    assert batches
    per_worker = [int(line.split()[1]) for line in report.read_text().splitlines()]
    assert len(per_worker) == workers
    assert per_worker == [max(1, share // workers)] * workers
    assert sum(per_worker) <= max(share, workers)
    explicit = ShardLoader(paths, index=index, batch_size=3, image_size=32, threads=2, rank=0, world_size=1)
    explicit.dataloader(workers)
    assert explicit.threads == 2, "threads= as given: each worker's pipeline runs that many"
