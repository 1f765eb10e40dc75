"""Defaults a loader takes from its environment."""

from __future__ import annotations

import os

import shardstream
from corpus import good_shard
from shardstream._system import available_cores


def test_decode_threads_are_shared_by_the_ranks_of_a_node(tmp_path, monkeypatch):
    """Under torchrun every rank of a node used to take all the node's cores: 8 ranks on 16
    cores ran 128 decode threads. The default is now the cores over the node's ranks."""
    shard = good_shard(str(tmp_path / "a.tar"), 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * available_cores()))
    assert shardstream.ShardLoader(shard, batch_size=2).threads == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert shardstream.ShardLoader(shard, batch_size=2).threads == available_cores()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert shardstream.ShardLoader(shard, batch_size=2).threads == available_cores()
    assert shardstream.ShardLoader(shard, batch_size=2, threads=3).threads == 3
    assert os.environ.get("LOCAL_WORLD_SIZE") is None
