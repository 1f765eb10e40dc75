"""The epoch plan, seen from Python: thin wrappers over the Rust plan (rust/src/plan/, the
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
    """Exact epochs over an index. Holds nothing per shard in Python: the index (in Rust) names
    the shards, and the plan hands each reader its spans directly. With ``shards`` (the URLs a
    user passed), shard i of the index is opened at the URL whose name matches its own."""

    def __init__(self, index: Any, shards: list[Any] | None, **source_options: Any) -> None:
        from shardstream.index import load_index
        from shardstream.urls import check_first_shard, index_source_config

        self.index = load_index(index, **source_options)
        if len(self.index) == 0:
            raise ValueError("the index lists no shard")
        if self.index.num_valid == 0:
            raise ValueError(
                f"the index schedules no sample: its {len(self.index):,} shards hold "
                f"{self.index.num_samples:,} samples, none valid or selected"
            )
        if shards is not None:
            from shardstream.hub import at_index_commit, unpinned
            from shardstream.index import index_name

            def key(name: str) -> str:
                # A relative local path names the same file as the absolute one an index records;
                # hf:// names match whatever commit each side was resolved at (the index's is read).
                return unpinned(index_name(name))

            names = list(self.index.urls)
            by_name = {key(s.display): s for s in shards}
            missing = [n for n in names if key(n) not in by_name]
            if missing or len(by_name) != len(names):
                raise ValueError(
                    f"the loader's shards and the index's differ ({len(shards)} vs {len(names)} shards; "
                    f"first not found: {missing[:1]}); pass the same URLs, or urls=None to use the index's"
                )
            ordered = [at_index_commit(n, by_name[key(n)]) for n in names]
            self.index = self.index.with_shard_names([s.url for s in ordered], [s.display for s in ordered])
            self._source_config = index_source_config(ordered, source_options)
        else:
            # A bounded number of existence and credential checks, whatever the shard count:
            # a missing shard further on is reported, by name, when it is read.
            check_first_shard(self.index.url(0), **source_options)
            self._source_config = index_source_config(None, source_options, schemes=self.index.schemes())
        self._cache: dict[tuple, Any] = {}
        self._remainder_keys: dict[tuple, list[str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Plans are cheap to remake and live in Rust: a pickle (spawned DataLoader workers) leaves
        # them out.
        return {**self.__dict__, "_cache": {}}

    def source_config(self) -> dict[str, Any]:
        """Reader options for the index's shards: the S3 signer and CA bundle when they need one."""
        return dict(self._source_config)

    def plan(self, params: dict[str, Any], state: dict[str, Any] | None) -> Any:
        key = _plan_key(params, state)
        if key not in self._cache:
            self._cache.clear()
            self._cache[key] = self.index.plan(plan_request(params, state))
        return self._cache[key]

    def reader(
        self, params: dict[str, Any], state: dict[str, Any] | None, rank: int, worker: int
    ) -> dict[str, Any]:
        return self.plan(params, state).reader(rank, worker)

    def remainder_keys(
        self, params: dict[str, Any], state: dict[str, Any] | None, options: dict
    ) -> list[str]:
        """Keys of the epoch's dropped remainder; with a version-2 index, read from the detail
        blocks of only the shards that hold it (once per plan)."""
        key = _plan_key(params, state)
        if key not in self._remainder_keys:
            self._remainder_keys.clear()
            config = {**options, **self._source_config}
            self._remainder_keys[key] = self.plan(params, state).remainder_keys(config)
        return self._remainder_keys[key]

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


def plan_request(params: dict[str, Any], state: dict[str, Any] | None) -> Any:
    """The core's request for the plan of ``params`` (the loader's plan settings: seed, epoch,
    world_size, workers, batch_size, block_size, drop_last), resumed from ``state`` if given."""
    return _core.PlanRequest(**params, state=json.dumps(state) if state else None)


def _plan_key(params: dict[str, Any], state: dict[str, Any] | None) -> tuple:
    return (tuple(sorted(params.items())), json.dumps(state, sort_keys=True) if state else None)
