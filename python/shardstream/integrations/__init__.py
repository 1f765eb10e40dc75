"""Thin adapters that put a :class:`shardstream.ShardLoader` inside the training loops people
already use, with exact mid-epoch resume: ``hf`` (transformers.Trainer), ``accelerate``
(Accelerator.prepare and save_state/load_state), ``lightning`` (a LightningDataModule) and
``open_clip`` (open_clip_train's own ``main`` on shardstream's data: ``torchrun -m
shardstream.integrations.open_clip``).

Importing ``shardstream`` never imports a framework; each adapter imports its own and, when it is
missing, says which pip extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingFrameworkError(ImportError):
    """An adapter's framework is not installed."""


def require(module: str, adapter: str, extra: str) -> ModuleType:
    """``module`` imported, or one line naming the pip extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingFrameworkError(
            f"shardstream.integrations.{adapter} needs {module.split('.')[0]}: "
            f"pip install 'shardstream[{extra}]'"
        ) from err
