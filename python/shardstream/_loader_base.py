"""What every loader shares, whatever its kind: rank and world, ``len()`` and
``batches_per_epoch``, epochs and the resume position, DataLoader workers (``shardstream._workers``)
and the merge of their stats, and the pass itself: lending the Rust pipeline batch buffers
(pooled, pinned when CUDA is present), taking its batches in order and closing it.

A kind's loader subclasses :class:`LoaderBase` and gives ``__len__``, ``_layout()`` (its batch
buffers), ``_iterate(worker, workers)`` (its pipeline, run by :meth:`LoaderBase._pass`),
``state_dict`` / ``load_state_dict`` (its plan's state) and ``stats``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from shardstream import _core, _workers
from shardstream._buffers import BufferPool, lend
from shardstream._stats import merge_stats
from shardstream._system import default_loader_threads, launch_rank_world
from shardstream._workers import WorkerSync, in_worker, open_workers
from shardstream.errors import MissingDependencyError, ShardError, from_core_fault

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

#: One batch buffer: its shape and numpy dtype.
Buffer = tuple[tuple[int, ...], Any]


def distributed_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values first, then torch.distributed when initialised, then RANK/WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r, w = launch_rank_world()
    return (r if rank is None else rank), (w if world_size is None else world_size)


class LoaderBase:
    """Base of every loader (see the module's documentation)."""

    #: What ``dataloader()`` allows: the fewest workers, and ``persistent_workers=True``.
    _min_workers = 0
    _persistent_workers = True

    def _init_loader(
        self, rank: int | None, world_size: int | None, threads: int | None, prefetch: int, pin: bool | None
    ) -> None:
        self._rank_arg, self._world_arg = rank, world_size
        self._threads_arg = threads
        self.prefetch = max(1, prefetch)
        # The batches in flight, the one in use and the one just let go (_buffers).
        self._buffers = BufferPool(keep=self.prefetch + 2)
        self._pin = pin if pin is not None else bool(torch is not None and torch.cuda.is_available())
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        # Set when a pass reads its epoch (or the rest of a resumed one) to the end.
        self._pass_completed = False
        self._reset_progress()
        self._last_stats: dict[str, Any] = {}
        # DataLoader worker processes reading this rank's share (0: read in this process).
        self._num_workers = 0
        self._worker_sync: WorkerSync | None = None

    # -- distribution and length ----------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank: the ``rank`` argument, else ``torch.distributed``'s, else
        ``RANK``, else 0 (read each time: a process group made after the loader counts)."""
        return distributed_rank_world(self._rank_arg, self._world_arg)[0]

    @property
    def threads(self) -> int:
        """Threads of each pipeline this loader runs: ``threads`` as given (each DataLoader
        worker runs a pipeline of that many), else this rank's share of the node's cores split
        among its DataLoader workers (a worker of K gets 1/K of the share: K workers that each
        took the whole share ran K times the cores)."""
        if self._threads_arg:
            return int(self._threads_arg)
        return max(1, default_loader_threads() // max(1, self._num_workers))

    @property
    def world_size(self) -> int:
        """The number of ranks, resolved as :attr:`rank` is (``WORLD_SIZE``, else 1)."""
        return distributed_rank_world(self._rank_arg, self._world_arg)[1]

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def batches_per_epoch(self) -> int:
        """The steps of this epoch as a framework counts them (``len()`` counts what is left after
        a resume): a whole epoch at this world size; resumed, the batches per rank done before
        the loaded position (in every phase, at the world sizes they were done at) plus those
        left. Lightning and Trainer, restored at step n of an epoch, stop it after this many."""
        if self._resume is None or int(self._resume["epoch"]) != self.epoch:
            return len(self)
        return sum(int(phase["batches_done"]) for phase in self._resume["phases"]) + len(self)

    @property
    def batches_per_whole_epoch(self) -> int:
        """The batches a whole epoch yields on this rank at this world size, from its beginning:
        what every epoch after a resumed one holds (a resumed epoch's :attr:`batches_per_epoch`
        counts the steps done before the resume at the world size they were done at)."""
        resume, self._resume = self._resume, None
        try:
            return len(self)
        finally:
            self._resume = resume

    # -- epochs and the position -----------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass read epoch ``epoch`` from its beginning (each epoch has its own
        order, derived from ``seed`` and ``epoch``).

        Right after :meth:`load_state_dict` of a state in that same epoch, the loaded position
        is kept instead: frameworks (HF Trainer, accelerate) restore the loader first and then
        set the epoch they resume in.

        Args:
            epoch: The epoch number, from 0.
        """
        epoch = int(epoch)
        if self._resume_pending() and int(self._resume["epoch"]) == epoch:  # type: ignore[index]
            return
        self.epoch = epoch
        self._load_position(None)

    def _load_position(self, resume: dict[str, Any] | None) -> None:
        """The next pass reads ``self.epoch`` from ``resume`` (None: from its beginning)."""
        self._resume = resume
        self._pass_completed = False
        self._reset_progress()
        self._publish_position()

    def _batches_consumed(self, batches: int | None) -> int:
        """What ``state_dict(batches)`` counts: ``batches``, else the batches yielded."""
        return self._batches_done if batches is None else int(batches)

    def _resume_pending(self) -> bool:
        """A state was loaded and no pass has yielded a batch of it yet."""
        return self._resume is not None and self._batches_done == 0 and not self._pass_completed

    def _publish_position(self) -> None:
        """Tells DataLoader worker processes the epoch and resume state to read next."""
        if self._worker_sync is not None:
            self._worker_sync.publish(self.epoch, self._resume)

    def _follow_main_process(self) -> None:
        """In a DataLoader worker: adopt the position the main process published. A persistent
        worker keeps the copy of the loader it was started with, so without this every epoch
        would replay the one it was started in."""
        if self._worker_sync is None or not in_worker():
            return
        self.epoch, self._resume = self._worker_sync.read()
        self._reset_progress()

    def _reset_progress(self) -> None:
        """Forgets the batches yielded since the epoch (or resume) began."""
        self._batches_done = 0
        # Per yielded batch, the kind's mark (ShardLoader: phase reader, reserve positions used).
        self._reserve_marks: list[Any] = []

    # -- passes (the hooks shardstream._workers calls) --------------------------------------
    def _begin_pass(self) -> None:
        """A new pass counts its batches from where it starts (the epoch's beginning, or the
        loaded position). A pass after one that read a resumed epoch to its end reads the epoch
        whole, as a StatefulDataLoader's next iterator does: the loaded position is used once."""
        if self._pass_completed and self._resume is not None:
            self._resume = None
            self._publish_position()
        self._pass_completed = False
        self._reset_progress()

    def _end_pass(self) -> None:
        self._pass_completed = True

    def _count_batch(self, mark: Any) -> None:
        self._batches_done += 1
        self._reserve_marks.append(mark)

    def _last_mark(self) -> Any:
        return self._reserve_marks[-1] if self._reserve_marks else None

    def _worker_stats(self) -> dict[str, Any]:
        return self._last_stats

    def _merge_worker_stats(self, per_worker: list[dict[str, Any]]) -> None:
        self._last_stats = merge_stats(per_worker)

    def _no_batch(self, error: ShardError | None) -> None:
        """A pass yielded no batch (``error``: it failed before its first): a kind may raise an
        error of its own from ``self._last_stats``. Default: nothing."""

    def _check_readers(self, readers: int) -> None:
        """Refuses ``readers`` (ranks x DataLoader workers) where the kind cannot split a pass so."""

    def _prepare_workers(self, num_workers: int) -> None:
        """Lays this rank's share out for ``num_workers`` DataLoader workers."""
        self._check_readers(self.world_size * max(int(num_workers), 1))
        self._num_workers = int(num_workers)
        if self._worker_sync is None:
            self._worker_sync = WorkerSync()
        self._publish_position()

    # -- DataLoader workers ----------------------------------------------------------------
    def dataset_view(self, num_workers: int) -> Any:
        """A ``torch.utils.data.IterableDataset`` for a DataLoader of your own, made with
        ``batch_size=None`` and ``num_workers`` worker processes: each worker reads its own part
        of this rank's share. Prefer :meth:`dataloader`, which also keeps the batch count and
        the workers' stats; with this view the count for :meth:`state_dict` is yours to pass
        (``state_dict(batches=n)``).

        Args:
            num_workers: The DataLoader's ``num_workers`` (0: read in the main process).

        Returns:
            The dataset view.

        Raises:
            OptionError: The pass cannot be split among that many readers (ranks x
                ``num_workers``): a :class:`~shardstream.ShardLoader` without an index or
                ``samples_per_epoch`` (a ``ValueError``).
            MissingDependencyError: torch is not installed.
        """
        if torch is None:
            raise MissingDependencyError("torch", "torch", "DataLoader worker processes")
        from shardstream._workers import WorkerView

        self._prepare_workers(num_workers)
        return WorkerView(self)

    def dataloader(self, num_workers: int, **kwargs: Any) -> Any:
        """A torch DataLoader in which ``num_workers`` worker processes read this rank's share,
        each a contiguous part of it, yielded in torch's round-robin order; the iterable it
        returns keeps the batch count that ``state_dict()`` needs and the workers' stats. Each
        worker runs its own pipeline on ``threads`` threads of its own.

        Args:
            num_workers: Worker processes (at least 1 for the kinds planned over unit weights).
            **kwargs: Passed to ``torch.utils.data.DataLoader`` (``pin_memory`` defaults to the
                loader's); ``batch_size``, ``collate_fn`` and ``sampler`` are refused, and
                ``persistent_workers=True`` by the kinds planned over unit weights (their
                workers read the epoch and the resume position when they start).

        Returns:
            An iterable with ``len()``, ``set_epoch``, ``state_dict``, ``load_state_dict`` and
            ``stats`` that act on this loader.

        Raises:
            OptionError: ``num_workers`` below what the kind takes.
            TypeError: a refused keyword.
            MissingDependencyError: torch is not installed.
        """
        return self._open_workers(num_workers, kwargs)

    def _open_workers(self, num_workers: int, kwargs: dict[str, Any], **options: Any) -> Any:
        return open_workers(
            self,
            num_workers,
            kwargs,
            pin=self._pin,
            min_workers=self._min_workers,
            persistent=self._persistent_workers,
            **options,
        )

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        wid, workers = _workers.worker()
        if workers > 1 and self._num_workers != workers:
            raise RuntimeError(
                f"this loader runs in a DataLoader with {workers} workers: make it with "
                f"loader.dataloader(num_workers={workers}) or loader.dataset_view(num_workers={workers})"
            )
        if not in_worker():
            self._begin_pass()
        self._follow_main_process()
        return self._iterate(wid, workers)

    def _iterate(self, worker: int, workers: int) -> Iterator[Any]:
        raise NotImplementedError

    def _layout(self) -> tuple[Buffer, Buffer | None]:
        """The buffers of a batch: the main one, and a second one (int64: token rows, position
        ids) or None."""
        raise NotImplementedError

    def _pinning(self) -> bool:
        # Inside a DataLoader worker (a forked process) CUDA must not be touched: the
        # DataLoader pins batches in the main process instead (dataloader() asks it to).
        return self._pin and torch is not None and not in_worker()

    def _lend(self, core: Any) -> tuple[Any, Any]:
        """Lends the pipeline a fresh batch's buffers (the second one, if the kind has it)."""
        (shape, dtype), second = self._layout()
        pin = self._pinning()
        main = self._buffers.empty(shape, dtype, pin=pin)
        extra = None if second is None else self._buffers.empty(second[0], second[1], pin=pin)
        lend(core, main, extra)
        return main, extra

    def _pass(
        self, core: Any, workers: int, make: Callable[[Any, Any, Any], tuple[Any, Any]]
    ) -> Iterator[Any]:
        """The batches of ``core``, a started pipeline (reader of one of ``workers``):
        ``make(result, main, second)`` turns what ``next_batch()`` returned and the buffers it
        filled into (the batch, its mark)."""
        lent: deque[tuple[Any, Any]] = deque()
        yielded = 0
        worker_process = in_worker()
        # A DataLoader worker: the main process reads its stats with every batch.
        stats_per_batch = worker_process or workers > 1
        try:
            # A caller may keep a yielded batch: its buffer is lent again only once nothing
            # refers to it (_buffers.BufferPool), and the pipeline never writes to a buffer
            # after handing it back.
            for _ in range(self.prefetch):
                lent.append(self._lend(core))
            while True:
                try:
                    result = core.next_batch()
                except _core.CoreFault as fault:
                    error = from_core_fault(fault)
                    if yielded == 0:
                        self._last_stats = core.stats()
                        self._no_batch(error)
                    raise error from None
                if result is None:
                    self._pass_completed = True
                    break
                batch, mark = make(result, *lent.popleft())
                self._count_batch(mark)
                if stats_per_batch:
                    self._last_stats = core.stats()
                yielded += 1
                yield batch
                lent.append(self._lend(core))
            # A DataLoader worker sees only its part of the pass: the main process decides, from
            # every worker's stats (shardstream._workers).
            if yielded == 0 and not worker_process:
                self._last_stats = core.stats()
                self._no_batch(None)
        finally:
            try:
                self._last_stats = core.stats()
            except ImportError:  # the interpreter is shutting down with this iterator still open
                pass
            core.close()
            # The pass's freed batch buffers stay in the C allocator's arenas until trimmed: without
            # this a DataLoader worker's RSS climbs for epochs (benches/soak.py).
            from shardstream.memory import release_memory

            release_memory()
