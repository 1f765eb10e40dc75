"""One agreed resume: rank 0 resolves ``--resume latest`` and broadcasts the checkpoint's identity
(name, step, sha256 recorded at save time); every rank hashes the file it would load, and unless
all hold the same bytes every rank stops with the same one-line error.

The multi-node cases run two "nodes" of one process each on this machine (static rendezvous, so
node 0 is global rank 0), each with its own ``train.output_dir``, as nodes with local disks are.
Before the agreement, node 1 found no checkpoint and started from scratch beside a resumed node 0:
two ranks training different weights together, silently."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from servers import free_ports
from shardstream.train import checkpoint as ckpt
from shardstream.train.dist import DistContext
from train_support import ROOT, SmallDataset, build_small_dataset, read_log, small_config_args, train_env

COMMON = [
    "--data.heldout", "", "--eval.zeroshot", "", "--train.max_steps", "8",
    "--checkpoint.every_steps", "0", "--log.every_steps", "2",
]  # fmt: skip
STOP = 3
SINGLE = DistContext(0, 1, 0, 1, torch.device("cpu"), None)


def run_two_nodes(
    data: SmallDataset, outs: tuple[Path, Path], *extra: str, timeout: float = 150
) -> list[tuple[int, str, str]]:
    """Both nodes' (exit status, stdout, stderr); each node writes into its own output_dir."""
    (port,) = free_ports(1)
    nodes = []
    try:
        for node_rank, out in enumerate(outs):
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
                "--master-addr=127.0.0.1", f"--master-port={port}",
                str(ROOT / "train_clip.py"), *small_config_args(data, out, *COMMON, *extra),
            ]  # fmt: skip
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            nodes.append(
                subprocess.Popen(cmd, cwd=ROOT, env=train_env(), text=True, start_new_session=True, **pipes)
            )
        deadline = time.monotonic() + timeout
        outputs = [node.communicate(timeout=max(1.0, deadline - time.monotonic())) for node in nodes]
    except subprocess.TimeoutExpired:
        pytest.fail(f"two-node run did not end within {timeout} s")
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    return [(node.returncode, out, err) for node, (out, err) in zip(nodes, outputs, strict=True)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SmallDataset:
    return build_small_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def stopped(dataset: SmallDataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A two-node run stopped after step 3: its checkpoint is on node 0's disk only."""
    root = tmp_path_factory.mktemp("stopped")
    outs = (root / "node0", root / "node1")
    for code, stdout, stderr in run_two_nodes(dataset, outs, "--train.stop_at_step", str(STOP)):
        assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert (outs[0] / "checkpoints" / ckpt.checkpoint_name(STOP)).is_file()
    assert not (outs[1] / "checkpoints").exists()
    return outs


def copy_run(outs: tuple[Path, Path], to: Path) -> tuple[Path, Path]:
    copies = (to / "node0", to / "node1")
    for source, copy in zip(outs, copies, strict=True):
        if source.exists():
            shutil.copytree(source, copy)
        else:  # only rank 0 writes into its output_dir
            copy.mkdir(parents=True)
    return copies


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("train_clip.py: error:")]


@pytest.mark.slow
@pytest.mark.parametrize("node1_sees", ["nothing", "other content"])
def test_ranks_that_see_different_checkpoints_all_stop_with_one_line(
    dataset: SmallDataset, stopped: tuple[Path, Path], tmp_path: Path, node1_sees: str
) -> None:
    outs = copy_run(stopped, tmp_path)
    name = ckpt.checkpoint_name(STOP)
    if node1_sees == "other content":
        # a stale copy: a valid checkpoint of the same name and step, with one weight changed
        payload = torch.load(outs[0] / "checkpoints" / name, weights_only=True)
        first = next(iter(payload["model"]))
        payload["model"][first] = payload["model"][first] + 1.0
        (outs[1] / "checkpoints").mkdir()
        torch.save(payload, outs[1] / "checkpoints" / name)
        shutil.copy(outs[0] / "checkpoints" / "latest", outs[1] / "checkpoints" / "latest")
    records_before = read_log(outs[0])

    start = time.monotonic()
    results = run_two_nodes(dataset, outs, "--resume", "latest", timeout=120)
    elapsed = time.monotonic() - start

    recorded = ckpt.file_sha256(outs[0] / "checkpoints" / name)
    verdict = "no such file" if node1_sees == "nothing" else "different content"
    for node, (code, stdout, stderr) in enumerate(results):
        assert code != 0, f"node {node} went on training:\n{stdout[-2000:]}"
        lines = error_lines(stderr)
        assert len(lines) == 1, f"node {node}:\n{stderr[-4000:]}"
        assert f"train.resume latest: checkpoint {name} (step {STOP}, sha256 {recorded[:16]})" in lines[0]
        assert f"not the same on every rank (rank 1: {verdict})" in lines[0]
        assert "terminate called" not in stderr
    # the same line on both ranks, and no step trained by either
    assert error_lines(results[0][2]) == error_lines(results[1][2])
    assert read_log(outs[0]) == records_before
    assert not (outs[1] / "log.jsonl").exists()
    assert elapsed < 90, f"{elapsed:.0f} s"


@pytest.mark.slow
def test_ranks_with_identical_copies_resume_together(
    dataset: SmallDataset, stopped: tuple[Path, Path], tmp_path: Path
) -> None:
    outs = copy_run(stopped, tmp_path)
    shutil.copytree(outs[0] / "checkpoints", outs[1] / "checkpoints")  # a copy on node 1's own disk
    results = run_two_nodes(dataset, outs, "--resume", "latest")
    for code, stdout, stderr in results:
        assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert f"at step {STOP} (epoch 0, step {STOP} in it)" in results[0][1]
    resumed = [r for r in read_log(outs[0]) if r["type"] == "step" and r["step"] > STOP]
    assert [r["step"] for r in resumed] == list(range(STOP + 1, 9))


# -- single process: the identity recorded at save time ----------------------------------------


def saved_checkpoint(directory: Path, step: int) -> Path:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    path = ckpt.save_checkpoint(
        directory,
        ctx=SINGLE,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state=ckpt.TrainingState(step, 0, step, None),
        config={},
        keep=0,
    )
    assert path is not None
    return path


def test_latest_resolves_to_the_recorded_identity(tmp_path: Path) -> None:
    saved_checkpoint(tmp_path, 4)
    path = saved_checkpoint(tmp_path, 7)
    identity = ckpt.agree_on_checkpoint(SINGLE, "latest", tmp_path)
    assert identity == ckpt.CheckpointIdentity(path.name, 7, ckpt.file_sha256(path), in_directory=True)
    assert identity.path_in(tmp_path) == path


def test_a_checkpoint_changed_after_saving_is_refused(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, 5)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.ResumeError) as e:
        ckpt.agree_on_checkpoint(SINGLE, "latest", tmp_path)
    assert str(e.value).startswith("train.resume latest: checkpoint step-00000005.pt (step 5, sha256 ")
    assert "(rank 0: different content)" in str(e.value)


def test_an_older_bare_pointer_and_a_path_are_hashed_on_rank_0(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, 6)
    (tmp_path / "latest").write_text(path.name + "\n")  # the pointer format before identities
    assert ckpt.agree_on_checkpoint(SINGLE, "latest", tmp_path) == ckpt.CheckpointIdentity(
        path.name, 6, ckpt.file_sha256(path), in_directory=True
    )
    by_path = ckpt.agree_on_checkpoint(SINGLE, str(path), tmp_path / "elsewhere")
    assert by_path == ckpt.CheckpointIdentity(str(path), 6, ckpt.file_sha256(path), in_directory=False)


def test_nothing_to_resume_and_a_missing_path(tmp_path: Path) -> None:
    assert ckpt.agree_on_checkpoint(SINGLE, "latest", tmp_path / "empty") is None
    missing = tmp_path / "step-00000009.pt"
    with pytest.raises(ckpt.ResumeError, match=f"train.resume {missing}: .*checkpoint file not found"):
        ckpt.agree_on_checkpoint(SINGLE, str(missing), tmp_path)
