"""Helpers for the trainer tests (no tests here): a real torchrun launcher that always stops what
it started, and a small demo-style dataset with its index."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
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


@contextlib.contextmanager
def started(cmd: list[str], *, cwd: Path = ROOT, extra_path: str | None = None) -> Iterator[subprocess.Popen]:
    """``cmd`` running in its own process group, its output piped; whatever is left of the group
    (torchrun and its workers) is killed on leaving."""
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
        yield proc
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.communicate()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of ``pid`` and those of all its descendants: torchrun starts
    each worker in a session of its own, so killing torchrun's group alone would leave them."""
    groups = {pid}
    for child in _descendants(pid):
        try:
            groups.add(os.getpgid(child))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgrp())
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_bounded(
    cmd: list[str], *, timeout: float, cwd: Path = ROOT, extra_path: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in its own process group; on timeout the whole group (torchrun and its
    workers) is killed and the test fails with the output so far."""
    with started(cmd, cwd=cwd, extra_path=extra_path) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
            pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-4000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun_command(
    script_args: list[str],
    *,
    port: int,
    nproc: int = 2,
    launcher_args: Sequence[str] = (),
    script: str | None = None,
    module: str | None = None,
) -> list[str]:
    """``python -m torch.distributed.run`` on loopback (``launcher_args``: more torchrun flags,
    e.g. --max-restarts=1), running train_clip.py unless a ``script`` or a ``module`` is given."""
    target = ["-m", module] if module else [script or str(ROOT / "train_clip.py")]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={port}", *launcher_args, *target, *script_args,
    ]  # fmt: skip


def torchrun(
    script_args: list[str],
    *,
    nproc: int = 2,
    timeout: float = 240,
    launcher_args: Sequence[str] = (),
    script: str | None = None,
    module: str | None = None,
    extra_path: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``torchrun_command`` with gloo. A free port can be taken between choosing and binding
    it, so a launch that fails on that alone is retried on another port."""
    for attempt in range(3):
        (port,) = free_ports(1)
        cmd = torchrun_command(
            script_args, port=port, nproc=nproc, launcher_args=launcher_args, script=script, module=module
        )
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
    zeroshot: str  # the labelled set (CLIP_benchmark's layout) of the held-out images
    zeroshot_index: str
    train_samples: int


def build_small_dataset(root: Path, *, train_per_class: int = 4, heldout_per_class: int = 1) -> SmallDataset:
    """The demo generator at a small size: shards, indexes and the labelled set under ``root``."""
    from shardstream.train.data import DemoSpec, ensure_demo_data

    spec = DemoSpec(
        train_per_class=train_per_class, heldout_per_class=heldout_per_class, samples_per_shard=40
    )
    paths = ensure_demo_data(root, spec, log=lambda _: None)
    assert paths.train_index and paths.heldout_index and paths.zeroshot_index
    classes = len((Path(paths.zeroshot) / "classnames.txt").read_text(encoding="utf-8").splitlines())
    return SmallDataset(
        train="::".join(paths.train_shards),
        train_index=paths.train_index,
        heldout="::".join(paths.heldout_shards),
        heldout_index=paths.heldout_index,
        zeroshot=paths.zeroshot,
        zeroshot_index=paths.zeroshot_index,
        train_samples=classes * train_per_class,
    )


def small_config_args(data: SmallDataset, output_dir: Path, *extra: str) -> list[str]:
    """Overrides for a fast run on ``data``: tiny batches, fp32 (bit-stable), no TensorBoard."""
    return [
        "--data.train", data.train, "--data.train_index", data.train_index,
        "--data.heldout", data.heldout, "--data.heldout_index", data.heldout_index,
        "--eval.zeroshot", data.zeroshot, "--eval.zeroshot_index", data.zeroshot_index,
        "--data.threads", "1", "--data.shuffle_buffer", "16",
        "--train.output_dir", str(output_dir), "--train.batch_size", "8", "--train.torch_threads", "1",
        "--model.precision", "fp32", "--log.tensorboard", "false", "--log.progress", "off",
        "--optim.warmup_steps", "2", "--eval.batch_size", "16",
        *extra,
    ]  # fmt: skip
