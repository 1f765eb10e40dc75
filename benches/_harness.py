"""Running one contender of a bench in its own process: a fresh interpreter, pinned to given
cores, that prints its figures as JSON on its last line of output.

The bench script runs itself with ``--worker NAME`` and one ``--OPTION JSON`` per argument; the
worker side calls :func:`pin` and :func:`report`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


class WorkerFailed(RuntimeError):
    """The worker exited non-zero (or could not start); the message ends with its stderr."""


def run_worker(
    script: str,
    name: str,
    options: dict[str, Any],
    *,
    python: str = sys.executable,
    timeout: float = 1800,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Runs ``python script --worker name --KEY VALUE ...`` (VALUE: ``str`` as is, anything else
    as JSON) and returns the JSON object on the last line it printed."""
    cmd = [python, os.path.abspath(script), "--worker", name]
    for key, value in options.items():
        cmd += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except FileNotFoundError as e:
        raise WorkerFailed(f"{name} worker could not start: {e}") from None
    if done.returncode != 0:
        raise WorkerFailed(f"{name} worker exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def try_worker(script: str, name: str, options: dict[str, Any], **kwargs: Any) -> dict[str, Any] | None:
    """:func:`run_worker`, or None (with a line on stderr) when the worker fails: the other
    contenders still run."""
    try:
        return run_worker(script, name, options, **kwargs)
    except WorkerFailed as e:
        print(f"  {name}: failed: {str(e)[-600:]}", file=sys.stderr)
        return None


def pin(cpus: str) -> None:
    """Pins this worker to the cores in ``cpus`` (a JSON list)."""
    os.sched_setaffinity(0, set(json.loads(cpus)))


def print_result(figures: dict[str, Any]) -> None:
    """The worker's result: one JSON line, the last it prints."""
    print(json.dumps(figures), flush=True)


def proc_kb(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM: the resident size and its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def write_proc(path: str, text: str) -> bool:
    """Writes ``text`` to a /proc control file; False where not allowed (not root, not Linux)."""
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    return write_proc("/proc/self/clear_refs", "5")


def drop_page_cache() -> bool:
    """Empties the kernel's page cache (root only), so that reads come from the disk."""
    return write_proc("/proc/sys/vm/drop_caches", "3")
