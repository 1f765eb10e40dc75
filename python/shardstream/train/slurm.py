"""Running under SLURM's ``srun`` without torchrun: SLURM's task variables become torch's.

``srun python train_clip.py`` starts N copies with ``SLURM_PROCID``/``SLURM_NTASKS`` set and no
``RANK``/``WORLD_SIZE``. Read as single processes they would train N independent jobs into one
``output_dir``, silently. Here each task becomes its rank, and the rendezvous address must be given
(``MASTER_ADDR``/``MASTER_PORT``, as sbatch scripts for torch set them); without it the run is refused
in one line rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class SlurmLaunchError(RuntimeError):
    """Several SLURM tasks without what they need to join one process group."""


def _tasks_on_this_node(env: Mapping[str, str], world_size: int) -> int:
    # SLURM_NTASKS_PER_NODE is set with --ntasks-per-node; SLURM_TASKS_PER_NODE always, as "4(x2),3"
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        match = re.match(r"^(\d+)", env.get(name, ""))
        if match:
            return int(match.group(1))
    return world_size


def torch_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables to set for a SLURM task (empty: nothing to do, because
    torchrun or another launcher set them, or SLURM started a single task)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    world_size = int(env.get("SLURM_NTASKS", "1") or 1)
    if world_size <= 1:
        return {}
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise SlurmLaunchError(
            f"{world_size} SLURM tasks (srun) without torchrun, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: export MASTER_ADDR=$(scontrol show hostnames "
            '"$SLURM_JOB_NODELIST" | head -n 1) and MASTER_PORT=29500 before srun, or start one '
            "torchrun per node"
        )
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(_tasks_on_this_node(env, world_size)),
    }


__all__ = ["SlurmLaunchError", "torch_environment"]
