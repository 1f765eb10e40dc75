"""DataLoader worker processes for every loader: the dataset view each worker iterates, the
iterable that counts the batches the main process yields (for ``state_dict``) and merges the
workers' stats, and the shared memory through which persistent workers follow the epoch and
resume position the main process sets.

A loader (``shardstream._loader_base.LoaderBase``, or a composite such as ``TextMixture``) takes
part through a few hooks: ``_prepare_workers(n)``, ``_begin_pass()``, ``_count_batch(mark)``,
``_end_pass()``, ``_no_batch(error)``, and in a worker ``iter(loader)``, ``_worker_stats()``
and ``_last_mark()``; in the main process ``_merge_worker_stats(per_worker)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from shardstream._stats import add_stats_delta, stats_delta
from shardstream.errors import MissingDependencyError, OptionError, ShardError

try:  # torch is optional: without it there are no worker processes.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

#: What a loader makes itself, so a DataLoader must not be given it.
REFUSED = ("batch_sampler", "batch_size", "collate_fn", "sampler")


def worker() -> tuple[int, int]:
    """(worker id, workers) inside a torch DataLoader worker process, else (0, 1)."""
    if torch is None:
        return 0, 1
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def in_worker() -> bool:
    """Whether this is a torch DataLoader worker process."""
    return torch is not None and torch.utils.data.get_worker_info() is not None


def open_workers(
    owner: Any,
    num_workers: int,
    kwargs: dict[str, Any],
    *,
    pin: bool,
    min_workers: int = 0,
    persistent: bool = True,
    transform: Callable[[Any], Any] | None = None,
    hint: str = "",
) -> CountingLoader:
    """``owner.dataloader(num_workers, **kwargs)``: checks the arguments, lays the owner out for
    ``num_workers`` workers and wraps a torch DataLoader over its view in a
    :class:`CountingLoader`. ``min_workers`` and ``persistent`` are what the kind allows;
    ``transform`` runs on each batch in its worker; ``hint`` ends the message refusing a
    DataLoader argument."""
    name = type(owner).__name__
    if torch is None:
        raise MissingDependencyError("torch", "torch", "DataLoader worker processes")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < min_workers:
        raise OptionError("num_workers", f"must be at least {min_workers}, not {num_workers!r}")
    refused = [k for k in REFUSED if k in kwargs]
    if refused:
        raise TypeError(
            f"{name}.dataloader() does not take {refused[0]}: the loader makes the batches itself{hint}"
        )
    if kwargs.get("persistent_workers") and not persistent:
        raise TypeError(f"{name}.dataloader() takes no persistent_workers=True: workers start per pass")
    view = WorkerView(owner)
    owner._prepare_workers(num_workers)
    view.with_stats, view.transform = True, transform
    kwargs.setdefault("pin_memory", pin)
    inner = torch.utils.data.DataLoader(view, batch_size=None, num_workers=num_workers, **kwargs)
    return CountingLoader(owner, inner)


class WorkerSync:
    """The epoch and resume state, in shared memory that the main process writes and DataLoader
    workers read each time they start an iteration (forked workers inherit it, spawned ones get
    it through torch's shared-memory pickling). JSON behind an 8-byte length: a resume state is a
    few hundred bytes per phase."""

    CAPACITY = 1 << 20

    def __init__(self) -> None:
        self._buffer = torch.zeros(self.CAPACITY, dtype=torch.uint8).share_memory_()

    def publish(self, epoch: int, resume: dict[str, Any] | None) -> None:
        data = json.dumps({"epoch": epoch, "resume": resume}).encode()
        if len(data) + 8 > self.CAPACITY:
            raise ValueError(
                f"resume state of {len(data)} bytes is too large to hand to DataLoader workers "
                f"(at most {self.CAPACITY - 8})"
            )
        view = self._buffer.numpy()
        view[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        view[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)

    def read(self) -> tuple[int, dict[str, Any] | None]:
        view = self._buffer.numpy()
        length = int.from_bytes(view[:8].tobytes(), "little")
        position = json.loads(view[8 : 8 + length].tobytes())
        return int(position["epoch"]), position["resume"]


class CountingLoader:
    """A DataLoader over a loader's :class:`WorkerView` that counts batches for ``state_dict``
    and merges the workers' stats (each worker sends what changed in its stats with every batch).

    It follows torchdata's StatefulDataLoader contract as the loader does with no workers:
    ``state_dict()`` is the position after the batches this iterable has yielded (the torch
    DataLoader's own read-ahead into its workers' queues is not counted), and
    ``load_state_dict`` makes the next pass continue there."""

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
        # Each worker's stats, rebuilt from its deltas: what it would have sent whole.
        per_worker: dict[int, dict[str, Any]] = {}
        yielded = 0
        for batch, wid, delta, mark in self.inner:
            add_stats_delta(per_worker.setdefault(wid, {}), delta)
            owner._merge_worker_stats(list(per_worker.values()))
            if batch is None:  # the stats of a worker that yielded no batch, sent as it ended
                continue
            if isinstance(batch, ShardError):  # a worker's error, with its stats
                if yielded == 0:
                    owner._no_batch(batch)
                raise batch
            owner._count_batch(mark)
            yielded += 1
            yield batch
        owner._end_pass()
        if yielded == 0:
            owner._no_batch(None)


if torch is not None:

    class WorkerView(torch.utils.data.IterableDataset):
        """What a DataLoader iterates: the owner's batches (in a worker process, that worker's
        part of the rank's share); with ``with_stats``, each with the worker's id, what changed
        in its stats, and the batch's mark (for ``reserve_use``)."""

        def __init__(self, owner: Any) -> None:
            self.owner = owner
            self.with_stats = False
            self.transform: Callable[[Any], Any] | None = None

        def __iter__(self) -> Iterator[Any]:
            if not self.with_stats:
                return iter(self.owner)
            return self._with_stats()

        def _with_stats(self) -> Iterator[tuple[Any, int, dict[str, Any], Any]]:
            owner, wid = self.owner, worker()[0]
            sent: dict[str, Any] = {}
            yielded = 0
            try:
                for batch in owner:
                    delta = stats_delta(owner._worker_stats(), sent)
                    if self.transform is not None:
                        batch = self.transform(batch)
                    yielded += 1
                    yield batch, wid, delta, owner._last_mark()
            except ShardError as error:
                # Sent as an item, the error reaches the main process whole (torch re-raises a
                # worker's exception as ``type(msg)``: a ShardError's reason would be the text).
                yield error, wid, stats_delta(owner._worker_stats(), sent), None
                return
            if yielded == 0:
                # Without a batch to carry them, this worker's stats (what it skipped) would
                # never reach the main process, which raises when no worker yielded a batch.
                yield None, wid, stats_delta(owner._worker_stats(), sent), None

        def __len__(self) -> int:
            return len(self.owner)
