"""The shardstream CLI run where users run it: as a distributed job under a real torchrun, and
with its output on a terminal (where it draws progress)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import train_support


def run_cli(args: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m shardstream ARGS`` in a process of its own, as a user types it."""
    import sys

    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args], capture_output=True, text=True, timeout=timeout
    )


def torchrun(args: list[str], *, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m shardstream ARGS`` on two ranks (see ``train_support.torchrun``)."""
    return train_support.torchrun(args, module="shardstream", timeout=timeout)


def run_on_pty(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, bytes]:
    """Runs a command with stdout and stderr on a pseudo-terminal; returns (exit status, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=max(1, deadline - time.monotonic())), output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
