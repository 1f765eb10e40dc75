"""Facts about the machine and the launch (torchrun's environment) that several modules need."""

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
    return max(1, available_cores() // max(1, env_int("LOCAL_WORLD_SIZE", 1)))


def env_int(name: str, default: int) -> int:
    """An integer environment variable; ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def torchrun_rank_world() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun sets them; (0, 1) outside a distributed launch. Raises
    ValueError when they are not integers or RANK is not below WORLD_SIZE."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(
            f"RANK={os.environ.get('RANK')!r} and WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
            "must be integers"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is not in range for WORLD_SIZE={world}")
    return rank, world
