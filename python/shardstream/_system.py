"""Facts about the machine and the launch that several modules need: the cores, and which rank
of how many this process is (torchrun's environment, else a Slurm ``srun`` step's).

The launch rule, one for the loaders, the count passes, the CLI and the trainer:

- ``RANK``/``WORLD_SIZE`` (torchrun, accelerate launch, mpirun wrappers) decide when set.
- Else a Slurm job step started by ``srun`` (``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS``,
  which srun sets for every task it starts) makes each task its own rank: ``srun -n 8 python
  train.py`` reads each sample once over the 8 tasks, as torchrun's 8 ranks would, instead of 8
  copies of the whole epoch. ``SLURM_LOCALID`` and the step's tasks on this node
  (``SLURM_STEP_TASKS_PER_NODE``) are the local rank and local world size.
- Else one process. An ``sbatch`` script itself is one process even in an allocation of many
  tasks: its ``SLURM_NTASKS`` counts what ``srun`` may start, not processes that exist, so it is
  not read (taking it would make the script rank 0 of N and read a N-th of the data).

Why adopt Slurm's variables rather than refuse them: a loader needs only its rank and the world
size to plan its share (no process group), so the tasks srun starts are all it takes; what does
need a process group (a distributed count pass, the trainer) also needs ``MASTER_ADDR`` and
``MASTER_PORT``, and is refused in one line without them (:func:`require_rendezvous`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping


def available_cores() -> int:
    """Cores this process may run on (the affinity mask on Linux, the CPU count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_loader_threads() -> int:
    """Decode threads a loader takes by default: this process's cores shared with the other
    ranks started on this node (:func:`local_world_size`), so 8 ranks on 16 cores run 16
    threads in all, not 128."""
    return max(1, available_cores() // local_world_size())


class LaunchError(RuntimeError):
    """Several ranks that need a process group, without what they need to form one."""


def _slurm_step(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """(rank, world, local rank, local world) of a task of an ``srun`` step of several tasks
    when no other launcher set ``RANK``; None otherwise (see the module docstring)."""
    if "RANK" in env or "SLURM_PROCID" not in env or not env.get("SLURM_STEP_NUM_TASKS"):
        return None
    try:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"])
        local_rank = int(env.get("SLURM_LOCALID") or 0)
    except ValueError:
        raise ValueError(
            f"SLURM_PROCID={env.get('SLURM_PROCID')!r}, SLURM_STEP_NUM_TASKS="
            f"{env.get('SLURM_STEP_NUM_TASKS')!r} and SLURM_LOCALID={env.get('SLURM_LOCALID')!r} "
            "must be integers"
        ) from None
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank} is not in range for SLURM_STEP_NUM_TASKS={world}")
    # "4(x2),3": the first node's count; a step's tasks on this node are this node's entry, but
    # every node of a homogeneous step has the same, which is what a per-node share needs.
    match = re.match(r"^(\d+)", env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    local_world = int(match.group(1)) if match else world
    return rank, world, local_rank, local_world


def local_world_size() -> int:
    """Ranks started on this node: ``LOCAL_WORLD_SIZE`` (torchrun), else an ``srun`` step's
    tasks on this node, else 1."""
    if os.environ.get("LOCAL_WORLD_SIZE"):
        return max(1, env_int("LOCAL_WORLD_SIZE", 1))
    step = _slurm_step(os.environ)
    return max(1, step[3]) if step is not None else 1


def require_rendezvous(world: int, env: Mapping[str, str] | None = None) -> None:
    """Refuses, in one line, a process group of ``world`` ranks that cannot rendezvous: several
    ranks from an ``srun`` step, and no ``MASTER_ADDR``/``MASTER_PORT`` (torchrun sets both).
    ``env``: the environment to read (default: this process's)."""
    env = os.environ if env is None else env
    if world <= 1 or _slurm_step(env) is None:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise LaunchError(
            f"{world} SLURM tasks (srun) without torchrun, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: export MASTER_ADDR=$(scontrol show hostnames "
            '"$SLURM_JOB_NODELIST" | head -n 1) and MASTER_PORT=29500 before srun, or start one '
            "torchrun per node"
        )


def torch_environment(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's variables for a task of an ``srun`` step (empty when another launcher
    set them, or the step has one task): what the trainer sets before it makes its process group."""
    step = _slurm_step(env)
    if step is None:
        return {}
    rank, world, local_rank, local_world = step
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
    }


def env_int(name: str, default: int) -> int:
    """An integer environment variable; ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def launch_rank_world() -> tuple[int, int]:
    """(rank, world size) of this process by the launch rule of the module docstring: RANK and
    WORLD_SIZE, else an ``srun`` step's task, else (0, 1). Raises ValueError when they are not
    integers or the rank is not below the world size."""
    step = _slurm_step(os.environ)
    if step is not None:
        return step[0], step[1]
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
