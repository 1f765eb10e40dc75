"""CLIP training on shardstream: open_clip models and loss, exact gradient accumulation, automatic
learning-rate scaling, atomic checkpoints with mid-epoch resume, held-out evaluation.

Run it with ``torchrun --nproc_per_node=N train_clip.py --config configs/X.yaml``, or from Python::

    from shardstream.train import load_config, train, Callback
    train(load_config("configs/demo_cpu.yaml", ["--train.epochs", "2"]), callbacks=[MyCallback()])
"""

from shardstream.train.callbacks import Callback
from shardstream.train.config import Config, ConfigError, load_config
from shardstream.train.loop import Trainer, train

__all__ = ["Callback", "Config", "ConfigError", "Trainer", "load_config", "train"]
