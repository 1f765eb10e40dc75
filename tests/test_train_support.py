"""Helpers for the trainer tests (no tests here): a real torchrun launcher that always stops what
it started, and a small demo-style dataset with its index."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import free_ports

ROOT = Path(__file__).resolve().parents[1]


def train_env(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", SHARDSTREAM_NO_PROGRESS="1")
    paths = [str(ROOT / "python"), extra_path or "", env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def run_bounded(
    cmd: list[str], *, timeout: float, cwd: Path = ROOT, extra_path: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in its own process group; on timeout the whole group (torchrun and its
    workers) is killed and the test fails with the output so far."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=train_env(extra_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-4000:]}\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(
    script_args: list[str],
    *,
    nproc: int = 2,
    timeout: float = 240,
    script: str | None = None,
    module: str | None = None,
    extra_path: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run`` on loopback with gloo; runs train_clip.py unless a
    ``script`` or a ``module`` is given. A free port can be taken between choosing and binding
    it, so a launch that fails on that alone is retried on another port."""
    target = ["-m", module] if module else [script or str(ROOT / "train_clip.py")]
    for attempt in range(3):
        (port,) = free_ports(1)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={port}", *target, *script_args,
        ]  # fmt: skip
        run = run_bounded(cmd, timeout=timeout, extra_path=extra_path)
        if run.returncode != 0 and "address already in use" in run.stderr.lower() and attempt < 2:
            continue
        return run
    raise AssertionError("unreachable")


def read_log(output_dir: Path) -> list[dict]:
    with open(output_dir / "log.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@dataclass(frozen=True)
class SmallDataset:
    train: str  # '::'-joined shard paths
    train_index: str
    heldout: str
    heldout_index: str
    classes: str
    train_samples: int


def build_small_dataset(root: Path, *, train_per_class: int = 4, heldout_per_class: int = 1) -> SmallDataset:
    """The demo generator at a small size: shards, indexes and classes.json under ``root``."""
    from shardstream.train.data import DemoSpec, ensure_demo_data

    spec = DemoSpec(
        train_per_class=train_per_class, heldout_per_class=heldout_per_class, samples_per_shard=40
    )
    paths = ensure_demo_data(root, spec, log=lambda _: None)
    assert paths.train_index and paths.heldout_index
    with open(paths.classes, encoding="utf-8") as f:
        classes = len(json.load(f))
    return SmallDataset(
        train="::".join(paths.train_shards),
        train_index=paths.train_index,
        heldout="::".join(paths.heldout_shards),
        heldout_index=paths.heldout_index,
        classes=paths.classes,
        train_samples=classes * train_per_class,
    )


def small_config_args(data: SmallDataset, output_dir: Path, *extra: str) -> list[str]:
    """Overrides for a fast run on ``data``: tiny batches, fp32 (bit-stable), no TensorBoard."""
    return [
        "--data.train", data.train, "--data.train_index", data.train_index,
        "--data.heldout", data.heldout, "--data.heldout_index", data.heldout_index,
        "--eval.zeroshot_classes", data.classes,
        "--data.threads", "1", "--data.shuffle_buffer", "16",
        "--train.output_dir", str(output_dir), "--train.batch_size", "8", "--train.torch_threads", "1",
        "--model.precision", "fp32", "--log.tensorboard", "false", "--log.progress", "off",
        "--optim.warmup_steps", "2", "--eval.batch_size", "16",
        *extra,
    ]  # fmt: skip
