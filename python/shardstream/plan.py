"""The epoch plan, seen from Python: thin wrappers over the Rust plan (rust/src/plan.rs, the
single definition; the contract is documented in docs/epoch-plan.md)."""

from __future__ import annotations

from shardstream import _core


def derive_seed(parts: list[int]) -> int:
    return _core.derive_seed([int(p) & 0xFFFFFFFFFFFFFFFF for p in parts])


def streaming_spans(
    num_shards: int,
    *,
    seed: int,
    epoch: int,
    rank: int,
    worker: int,
    world_size: int,
    workers: int,
    batch_size: int,
    block_size: int,
    samples_per_epoch: int | None,
) -> tuple[list[tuple[int, tuple[int, int] | None]], int | None, int]:
    """Shards of one reader when there is no index: ([(shard, stride)], batch quota, shuffle seed).

    With ``samples_per_epoch`` the reader cycles over its shards until it has produced its quota
    of batches, so every rank steps equally. Without it (a single reader) it reads every shard
    once, in the epoch's shard order.
    """
    quota_samples = samples_per_epoch if samples_per_epoch is not None else 0
    shards, (stride, offset), batches, shuffle_seed = _core.assign_shards(
        num_shards,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        workers=workers,
        batch_size=batch_size,
        block_size=block_size,
        samples_per_epoch=quota_samples,
        rank=rank,
        worker=worker,
    )
    stride_spec = (stride, offset) if stride > 1 else None
    return [(s, stride_spec) for s in shards], (batches if samples_per_epoch is not None else None), shuffle_seed
