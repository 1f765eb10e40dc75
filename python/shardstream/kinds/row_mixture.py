"""Mixtures by token weight, stratified per batch: every batch joins each source's share of its
rows, each source read by its own loader (one algorithm: the sources' plans are independent, and
a batch is the next batch of each).

Each source is planned on its own with ``rows_i`` of every batch's ``B`` rows, by largest
remainder of ``weight_i x B``: the weights are shares of tokens, every row holding ``seq_len`` of
them. The mixture's epoch is as long as the source that runs out first allows; the other
sources' batches not reached are reported per source (their loaders' ``remainder``), never read
twice within an epoch. Every rank yields the same number of batches, and a state holds each
source's position (resume, also onto another world size). :class:`~shardstream.TextMixture`
mixes text corpora; :class:`~shardstream.VlmMixture` interleaved, caption and text sources.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from shardstream import _workers
from shardstream.errors import OptionError


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


def check_weights(names: Sequence[str], weights: Sequence[Any], batch_size: int) -> list[int]:
    """The rows of each source (:func:`rows_per_source`), refusing a weight that is not positive
    or a source left no row."""
    if not names:
        raise OptionError("sources", "give at least one source")
    for w in weights:
        if isinstance(w, bool) or not (isinstance(w, (int, float)) and w > 0):
            raise OptionError("weight", f"must be positive, not {w!r}")
    rows = rows_per_source(list(weights), batch_size)
    if min(rows) == 0:
        small = names[rows.index(0)]
        detail = f"{batch_size} rows leave source {small!r} none: raise it or its weight"
        raise OptionError("batch_size", detail)
    return rows


class RowMixture:
    """The machinery of a mixture: its sources' loaders read side by side, one batch of each
    joined by :meth:`_join` (the subclass's), in one process or DataLoader workers, with stats
    and a state. Subclasses call ``super().__init__(sources, batch_size)`` (names and rows),
    then set ``loaders`` (each source's, seeded by :meth:`_source_seed`, with
    :meth:`_thread_share` threads) and ``seq_len``."""

    STATE_FORMAT: ClassVar[str]
    names: list[str]
    rows: list[int]
    loaders: list[Any]
    batch_size: int
    seq_len: int

    def __init__(self, sources: Sequence[Any], batch_size: int) -> None:
        """``sources``: each with ``weight`` and ``name`` (None: ``source{i}``)."""
        self.names = [s.name or f"source{i}" for i, s in enumerate(sources)]
        self.rows = check_weights(self.names, [s.weight for s in sources], batch_size)
        self.batch_size = batch_size
        self._batches_done = 0

    @staticmethod
    def _source_seed(seed: int, i: int) -> int:
        """Source ``i``'s seed under the mixture's ``seed``: each source orders its own units."""
        return seed * 1_000_003 + i

    def _thread_share(self, threads: int | None) -> int:
        """Each source's threads: ``threads`` (default: this process's share of the cores)
        shared out between the sources, at least one."""
        from shardstream._system import default_loader_threads

        return max(1, (threads or default_loader_threads()) // len(self.names))

    @staticmethod
    def _check_one_tokenizer(fingerprints: Sequence[str]) -> None:
        """Refuses sources counted with different tokenizers (their fingerprints differ)."""
        if len(set(fingerprints)) > 1:
            raise ValueError("the sources were counted with different tokenizers (or EOS/BOS)")

    def __len__(self) -> int:
        """Batches this rank yields in the current pass: the fewest any source has left."""
        return min(len(loader) for loader in self.loaders)

    @property
    def batches_per_epoch(self) -> int:
        """Steps of the epoch as a framework counts them (the fewest any source has)."""
        return min(loader.batches_per_epoch for loader in self.loaders)

    @property
    def epoch(self) -> int:
        """The epoch being read."""
        return self.loaders[0].epoch

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` in every source.

        Args:
            epoch: The epoch to read next.
        """
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if _workers.in_worker():
            return self._worker_part()
        self._begin_pass()
        return self._counted()

    def _counted(self) -> Iterator[Any]:
        for batch in self._iterate(len(self), 0, 1):
            self._count_batch(None)
            yield batch
        self._end_pass()

    def _worker_part(self) -> Iterator[Any]:
        """In DataLoader worker ``w`` of ``K``: the mixture's batches ``w, w + K, ...`` below
        ``len(self)`` (torch takes them round-robin). Every source's reader ``w`` holds that
        many batches (each source's share is split among the workers the same balanced way),
        but where :meth:`_next_part` pads a source short of them."""
        worker, workers = _workers.worker()
        n = len(self)
        return self._iterate(n // workers + (1 if worker < n % workers else 0), worker, workers)

    def _iterate(self, count: int, worker: int, workers: int) -> Iterator[Any]:
        """``count`` batches, each joining the next batch of every source's reader ``worker``
        (of ``workers``)."""
        iterators = [loader._iterate(worker, workers) for loader in self.loaders]
        try:
            for _ in range(count):
                yield self._join([self._next_part(i, it) for i, it in enumerate(iterators)])
        finally:
            for it in iterators:
                it.close()  # type: ignore[attr-defined]

    def _next_part(self, source: int, it: Iterator[Any]) -> Any:
        """Source ``source``'s next batch from its reader's iterator ``it``."""
        return next(it)

    def _source_done(self, source: int, done: int) -> int:
        """Of the mixture's ``done`` batches this pass, those source ``source`` read."""
        return done

    def _join(self, parts: list[Any]) -> Any:
        """One batch of the sources' batches ``parts`` (one each, in source order)."""
        raise NotImplementedError

    def _joined_cu_seqlens(self, parts: list[Any]) -> list[int]:
        """The sources' ``cu_seqlens`` over the joined rows: each source's offset by the tokens
        of the rows before it."""
        cu, base = [0], 0
        for p, rows in zip(parts, self.rows, strict=True):
            cu.extend(int(c) + base for c in p.cu_seqlens.tolist()[1:])
            base += rows * self.seq_len
        return cu

    # -- DataLoader workers (shardstream._workers, through the hooks below) -----------------
    def dataloader(self, num_workers: int, **kwargs: Any) -> Any:
        """A torch DataLoader in which ``num_workers`` worker processes read this rank's share
        of every source: worker ``w`` reads reader ``w`` of each source (each a contiguous part
        of that source's share, as a single loader's ``dataloader`` does) and joins their batches,
        so batch ``j`` in torch's round-robin order holds every source's batch ``j`` and its
        share of rows. ``state_dict``, ``load_state_dict`` and ``stats`` work through it: a
        state saved through it and loaded into a mixture read with as many workers gives
        exactly the batches that would have followed (with another count, each source
        re-plans its rest as its loader's ``load_state_dict`` does).

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
        """Each source's stats (its loader's ``stats``; its pipeline's counters include the
        batches it filled ahead) under its name, and ``tokens_by_source``: the row tokens
        (``rows x seq_len``, padding included) of each source in the batches this pass
        yielded."""
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
            gather: Ignored (as for a single loader's ``state_dict``).

        Returns:
            The state, for :meth:`load_state_dict`.
        """
        done = self._batches_done if batches is None else int(batches)
        return {
            "format": self.STATE_FORMAT,
            "rows": self.rows,
            "sources": [
                loader.state_dict(self._source_done(i, done)) for i, loader in enumerate(self.loaders)
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues every source where ``state`` left it.

        Args:
            state: What :meth:`state_dict` returned.

        Raises:
            ValueError: not a mixture's state, or one of other sources or weights.
        """
        if state.get("format") != self.STATE_FORMAT or len(state["sources"]) != len(self.loaders):
            raise ValueError(f"not a state of a {type(self).__name__} of these sources")
        if list(state["rows"]) != self.rows:
            raise ValueError(
                f"the state's rows per source {state['rows']} differ from these weights' {self.rows}"
            )
        for loader, s in zip(self.loaders, state["sources"], strict=True):
            loader.load_state_dict(s)
        self._batches_done = 0
