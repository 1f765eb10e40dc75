"""The collective timeout (``dist.timeout_s``) reaches the process group, on the torch this
suite pins and on torch releases without ``torch.distributed.set_timeout``.

The trainer used to call ``torch.distributed.set_timeout`` unconditionally: on torch 2.11 (the
CUDA image of the GPU machine ``benches/bench_cuda.py`` first ran on) every run died at start
with ``AttributeError: module 'torch.distributed' has no attribute 'set_timeout'``. The second
case removes that function, as those releases lack it, and joins a real one-process gloo group
through ``init_distributed``; each case runs in a process of its own, so the group and its
threads end with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from servers import free_ports

JOIN = r"""
import datetime, json, os, sys
import torch
import torch.distributed as dist
if sys.argv[1] == "without-set_timeout":
    del dist.set_timeout  # as in torch releases before it was public (2.11 among them)
from shardstream.train.config import DistConfig
from shardstream.train.dist import init_distributed

ctx = init_distributed(DistConfig(backend="gloo", timeout_s=77, join_timeout_s=30))
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
print(json.dumps({"world": ctx.world_size, "timeout_s": backend.options._timeout.total_seconds()}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("torch_api", ["with-set_timeout", "without-set_timeout"])
def test_the_collective_timeout_reaches_the_process_group(torch_api: str) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(free_ports(1)[0])
    done = subprocess.run(
        [sys.executable, "-c", JOIN, torch_api],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"world": 1, "timeout_s": 77.0}
