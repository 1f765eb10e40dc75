"""shardstream: fast, exact, fault-tolerant WebDataset streaming for distributed training."""

from shardstream._core import __version__
from shardstream.errors import ShardError
from shardstream.loader import Batch, ShardLoader
from shardstream.samples import read_samples

__all__ = ["Batch", "ShardError", "ShardLoader", "__version__", "read_samples"]
