"""Batch buffers are lent again (``shardstream._buffers.BufferPool``) only once nothing refers
to the batch made in them: a batch, or any view of it, that a caller keeps is never written
again, whether it is a torch tensor, a numpy array taken from one, or a numpy array."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from naflex_photos import photo_images  # noqa: E402
from shardstream import ShardLoader, _buffers  # noqa: E402
from shardstream._buffers import BufferPool  # noqa: E402
from shardstream.kinds import NaFlex, NaFlexBatch  # noqa: E402
from test_naflex import shard_of  # noqa: E402


def address(buf) -> int:
    return buf.data_ptr() if isinstance(buf, torch.Tensor) else buf.ctypes.data


VIEWS = {
    "slice": lambda t: t[1:],
    "reshape": lambda t: t.reshape(-1)[3:],
    "numpy": lambda t: t.numpy() if isinstance(t, torch.Tensor) else t.view(),
    "numpy slice": lambda t: (t.numpy() if isinstance(t, torch.Tensor) else t)[2:, ::2],
    "memoryview": lambda t: memoryview(t.numpy() if isinstance(t, torch.Tensor) else t),
}


@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_a_buffer_goes_back_only_when_its_last_view_is_gone(kind, view, monkeypatch):
    if kind == "numpy":  # the loader's output without torch installed
        monkeypatch.setattr(_buffers, "torch", None)
    pool = BufferPool(keep=4)
    batch = pool.empty((4, 8), np.uint8)
    assert isinstance(batch, torch.Tensor) == (kind == "torch")
    first = address(batch)
    kept = VIEWS[view](batch)
    del batch
    gc.collect()
    assert pool.free_buffers() == 0, "a view still shares the memory"
    other = pool.empty((4, 8), np.uint8)
    assert address(other) != first
    del kept
    gc.collect()
    assert pool.free_buffers() == 1
    again = pool.empty((4, 8), np.uint8)
    assert address(again) == first, "the memory nothing refers to is lent again"
    del other, again


def test_the_free_list_is_bounded_by_keep():
    pool = BufferPool(keep=2)
    held = [pool.empty(1000, np.uint8) for _ in range(5)]
    del held
    gc.collect()
    assert pool.free_buffers() == 2
    # Sizes are pooled apart, and pinned buffers (torch's host allocator's) never.
    other = pool.empty(10, np.int64)
    assert other.dtype == torch.int64 and other.shape == (10,)


def pixels_of(batch) -> torch.Tensor:
    return batch.pixel_values if isinstance(batch, NaFlexBatch) else batch.images


def _batches(loader, copy_now: bool) -> list[np.ndarray]:
    """Every batch's pixels: copied as it is yielded, or kept as yielded and copied at the end."""
    out = [pixels_of(b).numpy().copy() if copy_now else pixels_of(b) for b in loader]
    return [p.numpy().copy() if isinstance(p, torch.Tensor) else p for p in out]


@pytest.mark.parametrize("sample", ["square", "naflex"])
def test_batches_a_caller_keeps_are_never_overwritten(tmp_path, sample):
    """Real photos through the loader twice: once copying each batch as it is yielded (what it
    was), once keeping every batch to the end of the epoch; a buffer lent again while a kept
    batch still used it would change a kept batch. Dropping batches does reuse buffers."""
    path = shard_of(str(tmp_path / "photos.tar"), photo_images())
    options = dict(batch_size=4, threads=1, shuffle_buffer=1, drop_last=False, prefetch=1)
    if sample == "naflex":
        options["sample"] = NaFlex(patch_size=16, max_num_patches=64)
    else:
        options["image_size"] = 32

    as_yielded = _batches(ShardLoader([path], **options), copy_now=True)
    kept = _batches(ShardLoader([path], **options), copy_now=False)
    assert len(as_yielded) == len(kept) >= 10
    for i, (a, b) in enumerate(zip(as_yielded, kept, strict=True)):
        assert np.array_equal(a, b), f"kept batch {i} was overwritten"

    loader = ShardLoader([path], **options)
    addresses = set()
    for b in loader:
        addresses.add(address(pixels_of(b)))
        del b
    assert len(addresses) <= loader.prefetch + 2, "released buffers are lent again"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_large_buffer_costs_only_the_pages_written_and_goes_back_as_a_small_one():
    """A region sized for the largest batch (the interleaved kind's pixels) is an anonymous
    mapping: lending 256 MiB adds no resident memory until it is written, writing a quarter adds
    a quarter; and it is lent again only once its last view is gone, as a small buffer is."""
    pool = BufferPool(keep=2)
    size = 256 << 20
    before = _rss_bytes()
    batch = pool.empty(size, np.uint8)
    assert _rss_bytes() - before < 16 << 20, "lending touched the pages"
    batch.numpy()[: size // 4] = 7
    grown = _rss_bytes() - before
    assert size // 4 - (16 << 20) < grown < size // 4 + (16 << 20), grown
    kept = batch.numpy()[10:20]
    first = address(batch)
    del batch
    gc.collect()
    assert pool.free_buffers() == 0, "a view is still alive"
    assert (kept == 7).all()
    del kept
    gc.collect()
    assert pool.free_buffers() == 1
    again = pool.empty(size, np.uint8)
    assert address(again) == first, "the same memory lent again"
