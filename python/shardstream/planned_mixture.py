"""Mixtures: several datasets in one exact epoch, each in proportion to its weight.

``ShardLoader(sources=[Source(...), ...])`` plans the sources as one epoch (rust/src/plan/
mixture.rs; the contract is docs/epoch-plan.md section 7): every shuffle block, and so every
batch, holds each source in proportion to its share; a source is read without replacement and
goes on where it stopped in the next epoch, so a small source repeats only after all of it was
used and a large one is not exhausted. Resume and elastic resume work as for one dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shardstream import _core
from shardstream.plan import EpochPlanner


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture: ``ShardLoader(sources=[Source(...), ...], batch_size=...)``.

    Every batch holds each source in proportion to its share; a source is read without
    replacement and goes on where it stopped in the next epoch.

    Example:
        >>> sources = [Source(index="laion.index", weight=0.7),
        ...            Source(index="cc12m.index", weight=0.3, filter="width >= 200")]  # doctest: +SKIP

    Attributes:
        index: The source's index, as ``ShardLoader(index=...)`` takes it (required: exact
            planning needs the sample counts).
        urls: Where to open its shards instead of the index's URLs (as ``ShardLoader(urls=...)``).
            None (default): the index's.
        weight: Its share of the epoch's samples not fixed by ``samples_per_epoch`` of other
            sources, in proportion to the other weights. None (default): 1.0. Must be > 0.
        samples_per_epoch: Exactly this many samples of it every epoch, instead of a weight.
            None (default): by weight. Must be a positive integer.
        caption_key: Its caption member, overriding the loader's. None (default): the loader's.
        name: Its label in ``stats["samples_by_source"]`` and errors. None (default): its
            position. Names must differ.
        keys: Train on these samples only: a collection of keys or a file of keys, one per line.
        uids: Train on these samples only: DataComp uids (a ``.npy``, ``.parquet`` or text file,
            or a collection).
        filter: Train on the samples whose metadata matches, e.g. ``"similarity >= 0.28 and
            width >= 200"`` (``shardstream.subset`` has the grammar).
        metadata: Where ``filter`` and ``uids`` fields come from: ``"json"`` (default, each
            sample's json member) or ``"parquet"`` (img2dataset's Parquet beside each shard).
            The subset is made when the loader starts; for a large pool make it once with
            ``shardstream subset`` and pass its index instead.

    Raises:
        ValueError: No index, both ``weight`` and ``samples_per_epoch``, or either out of range.
    """

    index: Any = None
    urls: str | list[str] | None = None
    weight: float | None = None
    samples_per_epoch: int | None = None
    caption_key: str | None = None
    name: str | None = None
    keys: Any = None
    uids: Any = None
    filter: str | None = None
    metadata: str = "json"

    def __post_init__(self) -> None:
        label = self.name or "a source"
        if self.index is None:
            raise ValueError(
                f"{label}: a mixture source needs an index (exact planning needs its sample counts); "
                "build one with `shardstream index`"
            )
        if self.weight is not None and self.samples_per_epoch is not None:
            raise ValueError(f"{label}: give weight or samples_per_epoch, not both")
        if self.weight is not None and not (
            isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0
        ):
            raise ValueError(f"{label}: weight must be a positive number, got {self.weight!r}")
        if self.samples_per_epoch is not None and (
            not isinstance(self.samples_per_epoch, int) or self.samples_per_epoch < 1
        ):
            raise ValueError(
                f"{label}: samples_per_epoch must be a positive integer, got {self.samples_per_epoch!r}"
            )

    def share(self) -> tuple[str, float]:
        """What the mixture planner takes: ``("samples", n)`` or ``("weight", w)``.

        Returns:
            The kind of share and its value.
        """
        if self.samples_per_epoch is not None:
            return ("samples", float(self.samples_per_epoch))
        return ("weight", float(self.weight if self.weight is not None else 1.0))


class MixturePlanner(EpochPlanner):
    """:class:`EpochPlanner` over several sources: the plan numbers their shards source after
    source, and everything else (readers, remainder, resume states) is the same."""

    def __init__(self, sources: list[Source], epoch_samples: int | None, **source_options: Any) -> None:
        if not sources:
            raise ValueError("sources is empty: give at least one Source")
        from shardstream.urls import expand_urls

        self.sources = list(sources)
        self.names = [s.name or str(i) for i, s in enumerate(self.sources)]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"source names must differ, got {self.names}")
        self._parts = []
        for name, source in zip(self.names, self.sources, strict=True):
            shards = expand_urls(source.urls, **source_options) if source.urls is not None else None
            try:
                part = EpochPlanner(source.index, shards, **source_options)
                if source.keys is not None or source.uids is not None or source.filter is not None:
                    from shardstream.subset import subset_index

                    part.index, _ = subset_index(
                        part.index,
                        keys=source.keys,
                        uids=source.uids,
                        filter=source.filter,
                        metadata=source.metadata,
                        **source_options,
                    )
            except ValueError as e:
                raise ValueError(f"source {name!r}: {e}") from None
            self._parts.append(part)
        self._epoch_samples = epoch_samples
        self._source_config: dict[str, Any] = {}
        for part in self._parts:
            self._source_config.update(part.source_config())
        self.index = self._make_plan()
        self._cache: dict[tuple, Any] = {}
        self._remainder_keys: dict[tuple, list[str]] = {}

    def _make_plan(self) -> Any:
        # Sources are named by position in the core's errors, in the order of `sources`.
        return _core.MixturePlan(
            [p.index for p in self._parts], [s.share() for s in self.sources], self._epoch_samples
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("index")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.index = self._make_plan()

    @property
    def quotas(self) -> dict[str, int]:
        """Samples per epoch of each source, by name."""
        return dict(zip(self.names, self.index.quotas, strict=True))

    def first_shards(self) -> list[int]:
        return list(self.index.first_shards)

    def caption_keys(self) -> list[str | None]:
        return [s.caption_key for s in self.sources]
