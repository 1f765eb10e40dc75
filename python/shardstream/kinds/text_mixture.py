"""Mixtures of text corpora by token weight: e.g. FineWeb-Edu 0.7 and The Stack 0.3, every batch
holding each corpus's share of rows (stratified per batch, exactly), resumable.

Each corpus is planned on its own (:class:`~shardstream.TextLoader`, ``plan::packed``) with its
share of every batch's rows: ``rows_i`` of ``B`` by largest remainder of ``weight_i x B``, so
the weights are shares of tokens (every row holds ``seq_len`` of them). The mixture's epoch is as
long as the corpus that runs out first allows; the other corpora's tokens not reached are
reported per corpus, never read twice within an epoch. Every rank yields the same number of
batches, and a state holds each corpus's position (resume, also onto another world size).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream import _workers
from shardstream.config import SourceOptions
from shardstream.errors import OptionError
from shardstream.kinds.text import TextBatch, TextLoader, TokenCounts

STATE_FORMAT = "shardstream-text-mixture-state"


@dataclass(frozen=True)
class TextSource:
    """One corpus of a :class:`TextMixture`.

    Attributes:
        counts: Its :class:`~shardstream.TokenCounts`, or the path of a saved one.
        weight: Its share of every batch's tokens, relative to the other sources' weights.
        name: What its stats are reported under (default: ``source{i}``).
    """

    counts: TokenCounts | str | os.PathLike[str]
    weight: float
    name: str | None = None


def rows_per_source(weights: Sequence[float], batch_size: int) -> list[int]:
    """Each source's rows of a ``batch_size``-row batch: largest remainder of its weight's
    share, ties to the earlier source; every source must get at least one row."""
    total = float(sum(weights))
    exact = [w / total * batch_size for w in weights]
    rows = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - rows[i]), i))
    for i in order[: batch_size - sum(rows)]:
        rows[i] += 1
    return rows


class TextMixture:
    """Iterable of :class:`~shardstream.TextBatch` mixing text corpora by token weight.

    Args:
        sources: The corpora (:class:`TextSource`), all counted with the same tokenizer.
        batch_size: Rows per batch on one rank, over all sources.
        seq_len: Tokens per row.
        seed: Seeds every source's order (each source derives its own from it).
        block_rows: Rows per shuffle block of each source (see :class:`~shardstream.TextLoader`).
        boundaries: Also yield ``position_ids`` and ``cu_seqlens``.
        dtype: ``"int64"`` or ``"int32"``.
        rank: This process's rank (default as :class:`~shardstream.TextLoader`).
        world_size: Ranks (default as :class:`~shardstream.TextLoader`).
        threads: Tokenizing threads, shared out between the sources (default: this process's
            share of the cores).
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        OptionError: a weight is not positive, or a source would get no row of a batch.
        ValueError: the sources were counted with different tokenizers.
    """

    def __init__(
        self,
        sources: Sequence[TextSource],
        *,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        block_rows: int = 256,
        boundaries: bool = False,
        dtype: str = "int64",
        rank: int | None = None,
        world_size: int | None = None,
        threads: int | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        if not sources:
            raise OptionError("sources", "give at least one TextSource")
        for s in sources:
            if not (isinstance(s.weight, (int, float)) and s.weight > 0):
                raise OptionError("weight", f"must be positive, not {s.weight!r}")
        self.names = [s.name or f"source{i}" for i, s in enumerate(sources)]
        self.rows = rows_per_source([s.weight for s in sources], batch_size)
        if min(self.rows) == 0:
            small = self.names[self.rows.index(0)]
            raise OptionError(
                "batch_size", f"{batch_size} rows leave source {small!r} none: raise it or the weight"
            )
        from shardstream._system import default_loader_threads

        threads = threads or default_loader_threads()
        self.loaders = []
        for i, (s, rows) in enumerate(zip(sources, self.rows, strict=True)):
            counts = s.counts if isinstance(s.counts, TokenCounts) else TokenCounts.load(s.counts)
            self.loaders.append(
                TextLoader(
                    counts,
                    batch_size=rows,
                    seq_len=seq_len,
                    seed=seed * 1_000_003 + i,
                    block_rows=block_rows,
                    boundaries=boundaries,
                    dtype=dtype,
                    rank=rank,
                    world_size=world_size,
                    threads=max(1, threads // len(sources)),
                    source=source,
                )
            )
        fingerprints = {loader.counts.fingerprint for loader in self.loaders}
        if len(fingerprints) > 1:
            raise ValueError("the sources were counted with different tokenizers (or EOS/BOS)")
        self.batch_size, self.seq_len, self.boundaries = batch_size, seq_len, boundaries
        self._batches_done = 0

    def __len__(self) -> int:
        """Batches this rank yields in the current pass: the fewest any source has left."""
        return min(len(loader) for loader in self.loaders)

    @property
    def batches_per_epoch(self) -> int:
        """Steps of the epoch as a framework counts them (see TextLoader.batches_per_epoch)."""
        return min(loader.batches_per_epoch for loader in self.loaders)

    @property
    def epoch(self) -> int:
        """The epoch being read."""
        return self.loaders[0].epoch

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` (see :meth:`TextLoader.set_epoch`).

        Args:
            epoch: The epoch to read next.
        """
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[TextBatch]:
        if _workers.in_worker():
            return self._worker_part()
        self._begin_pass()
        return self._counted()

    def _counted(self) -> Iterator[TextBatch]:
        for batch in self._iterate(len(self), 0, 1):
            self._count_batch(None)
            yield batch
        self._end_pass()

    def _worker_part(self) -> Iterator[TextBatch]:
        """In DataLoader worker ``w`` of ``K``: the mixture's batches ``w, w + K, ...`` below
        ``len(self)`` (torch takes them round-robin). Every source's reader ``w`` holds at least
        that many batches: each source's share is split among the workers the same balanced
        way, and no source has fewer batches than the mixture."""
        worker, workers = _workers.worker()
        n = len(self)
        return self._iterate(n // workers + (1 if worker < n % workers else 0), worker, workers)

    def _iterate(self, count: int, worker: int, workers: int) -> Iterator[TextBatch]:
        """``count`` batches, each joining the next batch of every source's reader ``worker``
        (of ``workers``)."""
        import torch

        iterators = [loader._iterate(worker, workers) for loader in self.loaders]
        try:
            for _ in range(count):
                parts = [next(it) for it in iterators]
                ids = torch.cat([torch.as_tensor(p.input_ids) for p in parts])
                if not self.boundaries:
                    yield TextBatch(ids)
                    continue
                positions = torch.cat([torch.as_tensor(p.position_ids) for p in parts])
                cu, base = [0], 0
                for p, rows in zip(parts, self.rows, strict=True):
                    cu.extend(int(c) + base for c in p.cu_seqlens.tolist()[1:])
                    base += rows * self.seq_len
                max_len = max(int(p.max_seqlen) for p in parts)
                yield TextBatch(ids, positions, torch.tensor(cu, dtype=torch.int32), max_len)
        finally:
            for it in iterators:
                it.close()  # type: ignore[attr-defined]

    # -- DataLoader workers (shardstream._workers, through the hooks below) -----------------
    def dataloader(self, num_workers: int, **kwargs: Any) -> Any:
        """A torch DataLoader in which ``num_workers`` worker processes read this rank's share
        of every source: worker ``w`` reads reader ``w`` of each source (each a contiguous part
        of that source's share, as for :meth:`TextLoader.dataloader`) and joins their batches,
        so batch ``j`` in torch's round-robin order holds every source's batch ``j`` and its
        share of rows. ``state_dict``, ``load_state_dict`` and ``stats`` work through it: a
        state saved through it and loaded into a mixture read with as many workers gives
        exactly the batches that would have followed (with another count, each source
        re-plans its rest as :meth:`TextLoader.load_state_dict` does).

        Args:
            num_workers: Worker processes (at least 1).
            **kwargs: Passed to ``torch.utils.data.DataLoader``; ``batch_size``,
                ``collate_fn``, ``sampler`` and ``persistent_workers=True`` are refused.

        Returns:
            An iterable with ``len()``, ``set_epoch``, ``state_dict`` and ``load_state_dict``.

        Raises:
            OptionError: ``num_workers`` is below 1.
            TypeError: a refused keyword.
        """
        pin = self.loaders[0]._pin
        return _workers.open_workers(self, num_workers, kwargs, pin=pin, min_workers=1, persistent=False)

    def _prepare_workers(self, num_workers: int) -> None:
        for loader in self.loaders:
            loader._prepare_workers(num_workers)

    def _begin_pass(self) -> None:
        self._batches_done = 0
        for loader in self.loaders:
            loader._begin_pass()

    def _end_pass(self) -> None:
        # The sources' readers were closed at the mixture's end, not at their own: mark their
        # pass complete, so that a pass after a resumed epoch's end reads the next one whole.
        for loader in self.loaders:
            loader._end_pass()

    def _count_batch(self, mark: Any) -> None:
        self._batches_done += 1

    def _last_mark(self) -> None:
        return None

    def _no_batch(self, error: Any) -> None:
        return None

    def _worker_stats(self) -> dict[str, dict[str, Any]]:
        """Every source's counters, by its position."""
        return {str(i): loader._last_stats for i, loader in enumerate(self.loaders)}

    def _merge_worker_stats(self, per_worker: list[dict[str, dict[str, Any]]]) -> None:
        for i, loader in enumerate(self.loaders):
            loader._merge_worker_stats([counters.get(str(i), {}) for counters in per_worker])

    @property
    def stats(self) -> dict[str, Any]:
        """Each source's stats (see :attr:`TextLoader.stats`; its pipeline's counters include the
        batches it filled ahead) under its name, and ``tokens_by_source``: the tokens of each
        source in the batches this pass yielded."""
        per = {name: loader.stats for name, loader in zip(self.names, self.loaders, strict=True)}
        yielded = {
            name: self._batches_done * rows * self.seq_len
            for name, rows in zip(self.names, self.rows, strict=True)
        }
        return {"sources": per, "tokens_by_source": yielded, "exact": True}

    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        """Every source's position after the batches yielded (or ``batches``); the same on every
        rank.

        Args:
            batches: Batches consumed so far; default: those this mixture yielded.
            gather: Ignored (as for :meth:`TextLoader.state_dict`).

        Returns:
            The state, for :meth:`load_state_dict`.
        """
        done = self._batches_done if batches is None else int(batches)
        return {
            "format": STATE_FORMAT,
            "rows": self.rows,
            "sources": [loader.state_dict(done) for loader in self.loaders],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues every source where ``state`` left it.

        Args:
            state: What :meth:`state_dict` returned.

        Raises:
            ValueError: not a mixture's state, or one of other sources or weights.
        """
        if state.get("format") != STATE_FORMAT or len(state["sources"]) != len(self.loaders):
            raise ValueError("not a state of a TextMixture of these sources")
        if list(state["rows"]) != self.rows:
            raise ValueError(
                f"the state's rows per source {state['rows']} differ from these weights' {self.rows}"
            )
        for loader, s in zip(self.loaders, state["sources"], strict=True):
            loader.load_state_dict(s)
        self._batches_done = 0
