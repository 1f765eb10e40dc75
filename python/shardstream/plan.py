"""The epoch plan, seen from Python: thin wrappers over the Rust plan (rust/src/plan.rs, the
single definition; the contract is documented in docs/epoch-plan.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

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
    return (
        [(s, stride_spec) for s in shards],
        (batches if samples_per_epoch is not None else None),
        shuffle_seed,
    )


class EpochPlanner:
    """Exact epochs over an index: the shards of the index, mapped to the URLs to open."""

    def __init__(self, index: Any, shards: list[Any] | None, **source_options: Any) -> None:
        from shardstream.index import load_index
        from shardstream.urls import expand_urls

        self.index = load_index(index, **source_options)
        names = list(self.index.urls)
        if shards is None:
            shards = expand_urls(names, **source_options)
        by_name = {s.display: s for s in shards}
        missing = [n for n in names if n not in by_name]
        if missing or len(by_name) != len(names):
            raise ValueError(
                f"the loader's shards and the index's differ ({len(shards)} vs {len(names)} shards; "
                f"first not found: {missing[:1]}); pass the same URLs, or urls=None to use the index's"
            )
        self.shards = [by_name[n] for n in names]
        self._cache: dict[tuple, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Plans are cheap to remake and live in Rust: a pickle (spawned DataLoader workers) leaves
        # them out.
        return {**self.__dict__, "_cache": {}}

    def plan(self, params: dict[str, Any], state: dict[str, Any] | None) -> Any:
        key = (tuple(sorted(params.items())), json.dumps(state, sort_keys=True) if state else None)
        if key not in self._cache:
            self._cache.clear()
            self._cache[key] = self.index.plan(**params, state=json.dumps(state) if state else None)
        return self._cache[key]

    def reader(
        self, params: dict[str, Any], state: dict[str, Any] | None, rank: int, worker: int
    ) -> dict[str, Any]:
        return self.plan(params, state).reader(rank, worker, [s.url for s in self.shards])

    def state(
        self,
        params: dict[str, Any],
        state: dict[str, Any] | None,
        batches: int,
        reserve_used: Sequence[tuple[int, int, int]] = (),
    ) -> dict[str, Any]:
        """The state after ``batches`` more batches per rank; ``reserve_used`` = (rank, phase
        reader, reserve positions) used since ``state``, gathered from every rank."""
        return json.loads(self.plan(params, state).state(batches, list(reserve_used)))
