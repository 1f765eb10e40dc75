"""Torchrun jobs of tests/dist_worker.py for the distributed tests (test_distributed.py,
test_mixtures.py, test_subsets.py): W processes, gloo on 127.0.0.1, CPU only; every rank writes
its batches' keys to a JSON file, which :class:`Job` reads back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from servers import free_ports

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")
JOB_TIMEOUT = 240.0


class Job:
    """The outcome of one torchrun job: per-rank results, in rank order."""

    def __init__(self, ranks: list[dict[str, Any]], seconds: float, stderr: str) -> None:
        self.ranks, self.seconds, self.stderr = ranks, seconds, stderr

    def epoch(self, e: int) -> list[dict[str, Any]]:
        return [r["epochs"][str(e)] for r in self.ranks]

    def batches(self, e: int) -> list[list[list[str]]]:
        return [r["batches"] for r in self.epoch(e)]


def torchrun(
    world: int, args: list[str], out: str, *, timeout: float = JOB_TIMEOUT
) -> tuple[int, str, str, float]:
    """Runs one torchrun job in its own process group; on timeout the whole group is killed."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CI"):
        env.pop(name, None)
    for attempt in range(3):
        (port,) = free_ports(1)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={world}",
            "--master-addr=127.0.0.1", f"--master-port={port}", WORKER, "--out", out, *args,
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank it started
            stdout, stderr = proc.communicate()
            raise AssertionError(
                f"torchrun job (W={world}) hung for {timeout:.0f} s and was killed; "
                f"stderr tail:\n{stderr[-4000:]}"
            ) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        seconds = time.monotonic() - started
        # The free port may be taken between choosing and binding it: choose again.
        if proc.returncode != 0 and "address already in use" in stderr.lower() and attempt < 2:
            continue
        return proc.returncode, stdout, stderr, seconds
    raise AssertionError("unreachable")


def run_job(world: int, args: list[str], out: str) -> Job:
    rc, stdout, stderr, seconds = torchrun(world, args, out)
    assert rc == 0, f"torchrun job (W={world}) failed with {rc}:\n{stdout[-2000:]}\n{stderr[-6000:]}"
    ranks = []
    for r in range(world):
        with open(os.path.join(out, f"rank-{r}.json")) as f:
            ranks.append(json.load(f))
    for r, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (r, world)
        loader_view = (result["loader_rank"], result["loader_world_size"])
        assert loader_view == (r, world), "the loader takes rank and world size from torch.distributed"
    return Job(ranks, seconds, stderr)


class Jobs:
    """Memoised jobs, so tests that need the same uninterrupted run share one torchrun."""

    def __init__(self, root: Any) -> None:
        self.root, self.cache, self.count = root, {}, 0

    def __call__(self, world: int, args: list[str], *, fresh: bool = False) -> Job:
        key = (world, tuple(args))
        if fresh or key not in self.cache:
            self.count += 1
            self.cache[key] = run_job(world, args, str(self.root / f"job-{self.count}"))
        return self.cache[key]
