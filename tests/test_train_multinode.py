"""Multi-node training through torchrun's c10d rendezvous: two "nodes" of one process each on this
machine (--nnodes=2 --node-rank=i --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT), as
docs/multinode.md describes for Slurm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_ports
from train_support import ROOT, build_small_dataset, read_log, small_config_args, train_env


@pytest.mark.slow
def test_two_nodes_rendezvous_and_train_together(tmp_path: Path) -> None:
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    (port,) = free_ports(1)
    # 128 samples in global batches of 12: 10 steps per epoch and a drop_last tail of 8
    args = small_config_args(data, out, "--train.batch_size", "6", "--train.max_steps", "11")
    nodes = []
    try:
        for node_rank in (0, 1):
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=shardstream-test",
                "--local-addr=127.0.0.1",  # workers meet on loopback, not on the host's name
                str(ROOT / "train_clip.py"), *args,
            ]  # fmt: skip
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            nodes.append(
                subprocess.Popen(cmd, cwd=ROOT, env=train_env(), text=True, start_new_session=True, **pipes)
            )
        outputs = [node.communicate(timeout=240) for node in nodes]
    except subprocess.TimeoutExpired:
        pytest.fail("two-node run timed out")
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    for node, (stdout, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stdout + stderr

    records = read_log(out)
    assert records[0]["world_size"] == 2 and records[0]["backend"] == "gloo"
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 12))
    (epoch,) = [r for r in records if r["type"] == "epoch"]
    assert (epoch["epoch"], epoch["samples"], epoch["remainder"], epoch["skipped_total"]) == (0, 120, 8, 0)
    (evaluation,) = [r for r in records if r["type"] == "eval"]
    assert evaluation["samples"] == 32  # the held-out set split across the two nodes, each sample once
    # exactly one process (global rank 0) printed the run header
    printed = [stdout for stdout, _ in outputs if "global batch 12 = 6 per device x 2 ranks" in stdout]
    assert len(printed) == 1
