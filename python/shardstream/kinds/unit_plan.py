"""What the kinds planned over units by weight share: the text kind (tokens per unit) and the
NaFlex kind's token-budget batches (batches per unit). The Rust core's ``plan::packed`` cuts the
epoch's stream of positions (units in a seeded order, each its weight long) into equal shares
per rank and DataLoader worker; this base class holds the Python side of it: rank and world,
``len()``, epochs, DataLoader workers, and the resume state (phases of batches done, re-planned
onto another shape by arithmetic).

A subclass sets ``_weights`` (one per unit), ``_total`` and ``counts`` (with ``identity()``),
and gives ``_shape()``, ``_iterate()`` (its reader's batches, in order) and ``stats``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardstream import _core
from shardstream.errors import OptionError

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

STATE_FORMAT = "shardstream-packed-state"
STATE_VERSION = 1

Shape = tuple[int, int, int, int, int]


class UnitPlanLoader:
    """Base of the loaders planned over unit weights (see the module's documentation)."""

    counts: Any
    seed: int
    epoch: int
    _total: int
    _rank_arg: int | None
    _world_arg: int | None
    _num_workers: int
    _resume: dict[str, Any] | None
    _batches_done: int
    _pass_completed: bool
    _last_stats: dict[str, Any]
    _pin: bool

    def _init_position(self) -> None:
        self.epoch = 0
        self._resume = None
        self._batches_done = 0
        self._pass_completed = False
        self._last_stats = {}
        # DataLoader worker processes reading this rank's share (0: read in this process).
        self._num_workers = 0

    # -- distribution and length ----------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank (see the ``rank`` argument)."""
        from shardstream.loader import distributed_rank_world

        return distributed_rank_world(self._rank_arg, self._world_arg)[0]

    @property
    def world_size(self) -> int:
        """The number of ranks (see the ``world_size`` argument)."""
        from shardstream.loader import distributed_rank_world

        return distributed_rank_world(self._rank_arg, self._world_arg)[1]

    def _shape(self) -> Shape:
        raise NotImplementedError

    def _iterate(self) -> Iterator[Any]:
        raise NotImplementedError

    def _phases(self) -> list[tuple[Shape, int]]:
        """The resume state's phases (empty for a fresh epoch)."""
        if self._resume is None:
            return []
        return [(tuple(p["shape"]), int(p["batches_done"])) for p in self._resume["phases"]]  # type: ignore[misc]

    def _reader(self, worker: int) -> tuple[int, int, list[tuple[Shape, int]], Shape, int, int]:
        """Which reader of which epoch's plan the pipeline of DataLoader worker ``worker`` is:
        (seed, epoch, phases, current shape, rank, worker)."""
        return (self.seed, self.epoch, self._phases(), self._shape(), self.rank, worker)

    def _plan_counts(self) -> tuple[int, int, int]:
        return _core.packed_plan_counts(self._total, self.seed, self.epoch, self._phases(), self._shape())

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (after a resume: those left)."""
        return self._plan_counts()[0]

    @property
    def batches_per_epoch(self) -> int:
        """The steps of this epoch as a framework counts them (``len()`` counts what is left
        after a resume): the batches per rank done before the loaded position, in every phase
        (at the world sizes they were done at), plus those left."""
        done = sum(batches for _, batches in self._phases()) if self._resume is not None else 0
        return done + len(self)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its beginning; except right after :meth:`load_state_dict` of
        a state in that same epoch, whose position is kept (frameworks restore the loader, then
        set the epoch they resume in).

        Args:
            epoch: The epoch to read next (it seeds the order of units and batches).
        """
        epoch = int(epoch)
        if self._resume is not None and self._batches_done == 0 and int(self._resume["epoch"]) == epoch:
            return
        self.epoch = epoch
        self._resume = None
        self._batches_done = 0

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        return self._iterate()

    # What a pass through DataLoader workers (_CountingLoader, _WorkerView) calls; TextMixture
    # has the same five, so every kind planned over units shares that machinery.
    def _begin_pass(self) -> None:
        if self._pass_completed and self._resume is not None:
            # A pass after one that read a resumed epoch to its end reads the epoch whole.
            self._resume = None
        self._pass_completed = False
        self._batches_done = 0

    def _end_pass(self) -> None:
        self._pass_completed = True

    def _set_workers(self, num_workers: int) -> None:
        self._num_workers = num_workers

    def _worker_batches(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        """In a DataLoader worker: its reader's batches, each with its counters (faults left
        out: they stay bounded in the worker)."""
        for batch in self._iterate():
            yield batch, {k: v for k, v in self._last_stats.items() if k != "faults"}

    def _merge_worker_stats(self, per_worker: list[dict[str, Any]]) -> None:
        from shardstream.loader import merge_stats

        self._last_stats = merge_stats(per_worker)

    def dataloader(self, num_workers: int, **kwargs: Any) -> Any:
        """A torch DataLoader in which ``num_workers`` worker processes read this rank's share,
        each a contiguous part of it (``plan::packed``'s readers), yielded in torch's round-robin
        order; the iterable it returns keeps the batch count that ``state_dict()`` needs and the
        workers' stats. Each worker decodes or tokenizes on ``threads`` threads of its own.

        Args:
            num_workers: Worker processes (at least 1).
            **kwargs: Passed to ``torch.utils.data.DataLoader`` (``pin_memory`` defaults to the
                loader's); ``batch_size``, ``collate_fn``, ``sampler`` and
                ``persistent_workers=True`` are refused (workers read the epoch and the resume
                position when they start).

        Returns:
            An iterable with ``len()``, ``set_epoch``, ``state_dict`` and ``load_state_dict``.

        Raises:
            OptionError: ``num_workers`` is below 1.
            TypeError: a refused keyword.
        """
        return workers_dataloader(self, num_workers, kwargs, pin=self._pin)

    # -- resume --------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        """The position after the batches yielded so far (or ``batches``): small,
        JSON-serialisable and the same on every rank (every rank yields the same batches), so
        rank 0 can save it. ``gather`` is accepted for the framework adapters and does nothing:
        an epoch planned over unit weights has no per-rank reserve to collect.

        Args:
            batches: The batches consumed so far; default: those this loader yielded.
            gather: Ignored (see above).

        Returns:
            The state, for :meth:`load_state_dict`.
        """
        del gather
        done = self._batches_done if batches is None else int(batches)
        phases = [dict(p) for p in self._resume["phases"]] if self._resume is not None else []
        shape = list(self._shape())
        if phases and list(phases[-1]["shape"]) == shape:
            phases[-1]["batches_done"] = int(phases[-1]["batches_done"]) + done
        else:
            phases.append({"shape": shape, "batches_done": done})
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "counts": self.counts.identity(),
            "seed": self.seed,
            "epoch": self.epoch,
            "phases": phases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues the epoch of ``state`` at the exact next position; with another world size
        or shape, the rest of the epoch is re-planned so that every position left is read exactly
        once.

        Args:
            state: What :meth:`state_dict` returned (on any rank).

        Raises:
            ValueError: the state is not such a loader's, or was saved over other counts or
                another seed.
        """
        name = type(self).__name__
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a {name} state (no format {STATE_FORMAT!r})")
        if state.get("version") != STATE_VERSION:
            version = state.get("version")
            raise ValueError(f"{name} state version {version}, this package reads {STATE_VERSION}")
        if state["counts"] != self.counts.identity():
            raise ValueError(
                "this state was saved over other token counts or patch counts (another corpus, "
                "tokenizer or budget)"
            )
        if int(state["seed"]) != self.seed:
            raise ValueError(f"this state was saved with seed {state['seed']}, the loader has {self.seed}")
        self.epoch = int(state["epoch"])
        self._resume = {"epoch": self.epoch, "phases": [dict(p) for p in state["phases"]]}
        self._batches_done = 0
        self._pass_completed = False
        self._plan_counts()  # a state that does not fit the counts fails here, not mid-pass


def workers_dataloader(owner: Any, num_workers: int, kwargs: dict[str, Any], *, pin: bool) -> Any:
    """``owner.dataloader(num_workers, **kwargs)`` of a kind planned over units (TextLoader,
    NaFlexBudgetLoader, TextMixture): checks the arguments, lays the owner's plan out for the
    workers (its five pass hooks) and wraps the DataLoader."""
    name = type(owner).__name__
    if torch is None:
        raise RuntimeError(f"{name}.dataloader needs torch")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise OptionError("num_workers", f"must be at least 1, not {num_workers!r}")
    for refused in ("batch_size", "collate_fn", "sampler", "batch_sampler"):
        if refused in kwargs:
            raise TypeError(f"{name}.dataloader() takes no {refused}: the loader makes the batches")
    if kwargs.get("persistent_workers"):
        raise TypeError(f"{name}.dataloader() takes no persistent_workers=True: workers start per pass")
    owner._set_workers(num_workers)
    kwargs.setdefault("pin_memory", pin)
    view = _WorkerView(owner)
    inner = torch.utils.data.DataLoader(view, batch_size=None, num_workers=num_workers, **kwargs)
    return _CountingLoader(owner, inner)


class _CountingLoader:
    """A DataLoader over a kind's worker view: counts the batches it yields for ``state_dict``
    and merges the workers' counters (each sends its own with every batch)."""

    def __init__(self, owner: Any, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    def __len__(self) -> int:
        return len(self.owner)

    @property
    def batches_per_epoch(self) -> int:
        return self.owner.batches_per_epoch

    @property
    def epoch(self) -> int:
        return self.owner.epoch

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)

    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        return self.owner.state_dict(batches, gather=gather)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.owner.load_state_dict(state)

    @property
    def stats(self) -> dict[str, Any]:
        return self.owner.stats

    def __iter__(self) -> Iterator[Any]:
        owner = self.owner
        owner._begin_pass()
        per_worker: dict[int, Any] = {}
        for batch, worker, stats in self.inner:
            owner._batches_done += 1
            per_worker[worker] = stats
            owner._merge_worker_stats(list(per_worker.values()))
            yield batch
        owner._end_pass()


if torch is not None:

    class _WorkerView(torch.utils.data.IterableDataset):
        """What each DataLoader worker iterates: the owner's batches for that worker, each with
        the worker's id and counters."""

        def __init__(self, owner: Any) -> None:
            self.owner = owner

        def __iter__(self) -> Iterator[tuple[Any, int, Any]]:
            worker = torch.utils.data.get_worker_info()
            wid = 0 if worker is None else worker.id
            for batch, counters in self.owner._worker_batches():
                yield batch, wid, counters
