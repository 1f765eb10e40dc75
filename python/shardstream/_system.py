"""Facts about the machine that several modules need."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (the affinity mask on Linux, the CPU count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
