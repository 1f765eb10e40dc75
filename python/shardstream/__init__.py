"""shardstream: fast, exact, fault-tolerant WebDataset streaming for distributed training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardstream._core import __version__
from shardstream.config import DEFAULTS, LoaderConfig
from shardstream.errors import ShardError
from shardstream.mixture import Source
from shardstream.samples import read_samples

if TYPE_CHECKING:
    from shardstream.loader import Batch, ShardLoader

__all__ = [
    "DEFAULTS",
    "Batch",
    "LoaderConfig",
    "ShardError",
    "ShardLoader",
    "Source",
    "__version__",
    "read_samples",
]


def __getattr__(name: str) -> Any:
    # The loader imports torch (seconds); the CLI and read_samples do not need it.
    if name in ("ShardLoader", "Batch"):
        from shardstream import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
