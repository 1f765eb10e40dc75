"""CLIP training on shardstream: open_clip models and loss, exact gradient accumulation, automatic
learning-rate scaling, atomic checkpoints with mid-epoch resume, held-out evaluation.

Run it with ``shardstream train --config NAME``, ``torchrun --nproc_per_node=N -m shardstream.train
--config NAME`` (or ``train_clip.py`` at the repository root), where NAME is a config shipped in
``shardstream/train/configs/`` (``demo_cpu``, ``vit_b32``, ...) or a YAML path; or from Python::

    from shardstream.train import load_config, train, Callback
    train(load_config("demo_cpu", ["--train.epochs", "2"]), callbacks=[MyCallback()])

The names are imported on first use, so that ``train_clip.py`` can check the trainer's packages
(``shardstream[train]``: torch, open_clip, pyyaml, tensorboard) before anything imports them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Callback": "shardstream.train.callbacks",
    "Config": "shardstream.train.config",
    "ConfigError": "shardstream.train.config",
    "load_config": "shardstream.train.config",
    "Trainer": "shardstream.train.loop",
    "train": "shardstream.train.loop",
}

__all__ = ["Callback", "Config", "ConfigError", "Trainer", "load_config", "train"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
