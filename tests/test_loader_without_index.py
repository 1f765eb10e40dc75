"""The migration trap of issue 42: ``ShardLoader(urls, batch_size=...)`` without an index works on
one process, and with several readers (ranks, or ranks x DataLoader workers) it needs
``samples_per_epoch``. That is refused when the loader is made (or its DataLoader), not at the
first batch, as an :class:`~shardstream.OptionError` whose message gives both ways out. The same
under a real torchrun is in tests/test_distributed.py."""

from __future__ import annotations

import pytest
import shardstream
from corpus import good_samples, sample_members, tar_bytes, write_file
from shardstream import OptionError
from shardstream.index import build_index, write_index


@pytest.fixture
def shards(tmp_path):
    paths = []
    for i in range(2):
        samples = good_samples(6, seed=70 + i, prefix=f"m{i}_")
        members = [m for k, s in samples for m in sample_members(k, s)]
        paths.append(write_file(str(tmp_path / f"m-{i}.tar"), tar_bytes(members)))
    return paths


def _says_the_fix(error: pytest.ExceptionInfo[OptionError]) -> None:
    message = str(error.value)
    assert error.value.option == "samples_per_epoch"
    assert "several readers without an index need samples_per_epoch" in message
    assert "index=" in message and "shardstream index" in message and "samples_per_epoch=N" in message
    assert isinstance(error.value, ValueError)  # code that caught the old ValueError still does


def test_two_ranks_without_an_index_fail_when_the_loader_is_made(shards):
    with pytest.raises(OptionError) as error:
        shardstream.ShardLoader(shards, batch_size=2, image_size=32, rank=0, world_size=2)
    _says_the_fix(error)
    assert "2 readers: 2 ranks" in str(error.value)


def test_torchruns_world_size_is_seen_when_the_loader_is_made(shards, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(OptionError) as error:
        shardstream.ShardLoader(shards, batch_size=2, image_size=32)
    _says_the_fix(error)


def test_dataloader_workers_are_readers_too(shards):
    loader = shardstream.ShardLoader(shards, batch_size=2, image_size=32, threads=1)
    assert len(list(loader)) == 6  # one process, one reader: streams as before
    for make in (loader.dataloader, loader.dataset_view):
        with pytest.raises(OptionError) as error:
            make(2)
        _says_the_fix(error)
        assert "2 readers: 1 rank(s) x 2 workers" in str(error.value)


def test_either_fix_in_the_message_works(shards, tmp_path):
    streaming = shardstream.ShardLoader(
        shards, batch_size=2, image_size=32, threads=1, rank=1, world_size=2, samples_per_epoch=8
    )
    assert len(streaming) == 2 and len(list(streaming)) == 2
    index = write_index(build_index(shards, threads=1), str(tmp_path / "m.index"))
    exact = shardstream.ShardLoader(index=index, batch_size=2, image_size=32, threads=1, rank=1, world_size=2)
    assert len(list(exact)) == len(exact) == 3
