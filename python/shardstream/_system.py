"""Facts about the machine that several modules need."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (the affinity mask on Linux, the CPU count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_loader_threads() -> int:
    """Decode threads a loader takes by default: this process's cores shared with the other
    ranks torchrun started on this node (LOCAL_WORLD_SIZE), so 8 ranks on 16 cores run 16
    threads in all, not 128."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return max(1, available_cores() // max(1, local_ranks))
