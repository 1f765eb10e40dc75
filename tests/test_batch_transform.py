"""Python-side transforms: ``ShardLoader.dataloader(batch_transform=fn)`` runs ``fn`` on every
batch in the DataLoader worker processes, on real photo shards, and GPU-style augmentation of the
uint8 batch with torchvision.transforms.v2 as the docstring describes it."""

from __future__ import annotations

import functools
import os
import zlib

import pytest
import torch
from servers import build_photo_shards
from shardstream import Batch, ShardLoader, build_index, write_index


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    """Four shards of real photos and their index (several workers need one for exact epochs)."""
    directory = tmp_path_factory.mktemp("photos")
    build_photo_shards(str(directory), shards=4, per_shard=10, seed=5)
    write_index(build_index(str(directory), decode=False), str(directory / "index"))
    return str(directory)


def _loader(photo_dir: str) -> ShardLoader:
    index = os.path.join(photo_dir, "index")
    return ShardLoader(index=index, batch_size=4, image_size=48, drop_last=False, threads=1, seed=7)


def _chosen(key: str) -> bool:
    """A per-sample decision that does not depend on the process: a hash of the key."""
    return zlib.crc32(key.encode()) % 2 == 0


def flip_chosen(batch: Batch, log_dir: str | None = None) -> Batch:
    """Mirrors the chosen samples of the batch; records the process it ran in."""
    if log_dir is not None:
        with open(os.path.join(log_dir, f"{os.getpid()}.pid"), "a") as f:
            f.write(f"{len(batch.keys)}\n")
    mask = torch.tensor([_chosen(k) for k in batch.keys])
    images = torch.where(mask[:, None, None, None], batch.images.flip(-1), batch.images)
    return batch._replace(images=images)


def not_a_batch(batch: Batch) -> dict:
    return {"images": batch.images}


def _by_key(batches) -> dict[str, torch.Tensor]:
    return {key: b.images[i].clone() for b in batches for i, key in enumerate(b.keys)}


def test_the_transform_runs_in_the_workers_on_every_batch(photo_dir, tmp_path):
    plain = _by_key(_loader(photo_dir).dataloader(2))
    log_dir = tmp_path / "pids"
    log_dir.mkdir()
    transform = functools.partial(flip_chosen, log_dir=str(log_dir))
    batches = list(_loader(photo_dir).dataloader(2, batch_transform=transform))
    assert all(isinstance(b, Batch) for b in batches)
    flipped = _by_key(batches)
    assert sorted(flipped) == sorted(plain) and len(plain) == 40, "every sample once, as without"
    chosen = [k for k in plain if _chosen(k)]
    assert 0 < len(chosen) < len(plain)
    for key, image in plain.items():
        expected = image.flip(-1) if _chosen(key) else image
        assert torch.equal(flipped[key], expected), key
    pids = {int(name.removesuffix(".pid")) for name in os.listdir(log_dir)}
    assert len(pids) == 2 and os.getpid() not in pids, "ran in the two worker processes"
    counted = sum(int(n) for name in os.listdir(log_dir) for n in (log_dir / name).read_text().split())
    assert counted == 40, "on every batch, once"


def test_stats_and_resume_are_kept_through_the_transform(photo_dir):
    """The transform sits between the workers and the counting: stats add up, and a state taken
    after three transformed batches resumes at exactly the next sample."""
    loader = _loader(photo_dir)
    everything = sorted(k for b in loader.dataloader(2, batch_transform=flip_chosen) for k in b.keys)
    assert len(everything) == 40 and loader.stats["samples"] == 40
    first = []
    for n, batch in enumerate(loader.dataloader(2, batch_transform=flip_chosen), start=1):
        first.extend(batch.keys)
        if n == 3:
            break
    state = loader.state_dict()
    resumed = _loader(photo_dir)
    resumed.load_state_dict(state)
    rest = [k for b in resumed.dataloader(2, batch_transform=flip_chosen) for k in b.keys]
    assert len(first) == 12 and sorted(first + rest) == everything


def test_a_transform_that_returns_no_batch_is_a_type_error(photo_dir):
    with pytest.raises(TypeError, match="batch_transform must return a shardstream.Batch"):
        list(_loader(photo_dir).dataloader(1, batch_transform=not_a_batch))


def test_a_collate_fn_is_refused_pointing_at_batch_transform(photo_dir):
    with pytest.raises(TypeError, match="does not take collate_fn.*batch_transform=fn"):
        _loader(photo_dir).dataloader(2, collate_fn=lambda items: items)


def test_torchvision_v2_takes_the_uint8_batch_as_it_is(photo_dir):
    """The GPU-side recipe of the docstring, on the CPU: v2 transforms accept the batch tensor
    (uint8, [B, 3, S, S]) unchanged and keep its dtype, and draw one set of random parameters per
    call, so the whole batch is flipped or none of it."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    batch = next(iter(_loader(photo_dir)))
    flipped = v2.RandomHorizontalFlip(p=1.0)(batch.images)
    assert flipped.dtype == torch.uint8 and torch.equal(flipped, batch.images.flip(-1))
    torch.manual_seed(0)
    outcomes = set()
    for _ in range(16):
        out = v2.RandomHorizontalFlip(p=0.5)(batch.images)
        per_sample = [torch.equal(out[i], batch.images[i].flip(-1)) for i in range(len(batch.keys))]
        assert len(set(per_sample)) == 1, "one decision for the whole batch"
        outcomes.add(per_sample[0])
    assert outcomes == {True, False}
    normalised = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)])(
        batch.images
    )
    assert normalised.dtype == torch.float32
    assert -1.0 <= float(normalised.min()) <= float(normalised.max()) <= 1.0
