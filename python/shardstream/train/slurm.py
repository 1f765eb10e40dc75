"""Running under SLURM's ``srun`` without torchrun: SLURM's task variables become torch's.

``srun python train_clip.py`` starts N copies with ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS`` set
and no ``RANK``/``WORLD_SIZE``. Read as single processes they would train N independent jobs into
one ``output_dir``, silently. Here each task becomes its rank (the launch rule of
``shardstream._system``, which the loaders and the CLI follow too), and the rendezvous address must
be given (``MASTER_ADDR``/``MASTER_PORT``, as sbatch scripts for torch set them); without it the
run is refused in one line rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping

from shardstream._system import LaunchError, require_rendezvous
from shardstream._system import torch_environment as _step_environment

#: Several SLURM tasks without what they need to join one process group.
SlurmLaunchError = LaunchError


def torch_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables to set for a SLURM task (empty: nothing to do, because
    torchrun or another launcher set them, or SLURM started a single task).

    Raises:
        SlurmLaunchError: several tasks, and no ``MASTER_ADDR``/``MASTER_PORT``.
    """
    variables = _step_environment(env)
    if variables:
        require_rendezvous(int(variables["WORLD_SIZE"]), env)
    return variables


__all__ = ["SlurmLaunchError", "torch_environment"]
