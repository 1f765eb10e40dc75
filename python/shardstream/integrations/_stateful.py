"""The loader as training frameworks see it (shared by the adapters): a StatefulDataLoader-style
iterable whose ``len()`` is a whole epoch, whose ``state_dict`` gathers the ranks' reserve use at
the framework's checkpoint hook, and whose batches may be turned into the framework's input."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from shardstream._loader_base import LoaderBase
from shardstream.loader import Batch


class FrameworkLoader:
    """``loader`` (read in this process, or by ``num_workers`` DataLoader workers) for a framework.

    - ``len()`` is the steps of the epoch the framework is about to run, as frameworks count
      them (``ShardLoader.batches_per_epoch``): a whole epoch, and after a resume the n steps
      done before it plus the batches left, also when the world size changed (Lightning stops
      at ``len()`` fetched batches, counting the n it restored). With ``epoch_of`` the epoch is
      read from the framework first, so a length asked for before the next pass begins is that
      pass's: after a resume onto another world size the resumed epoch and the whole epochs
      after it differ in length. Knowing the length also keeps Lightning's fetcher from reading
      ahead.
    - ``state_dict()`` is the position after the batches handed to the framework, with every
      rank's reserve use gathered (``gather``): a collective, which is safe because the adapters
      call it from checkpoint hooks that every rank runs in the same order.
    - ``set_epoch(e)`` right after ``load_state_dict`` of a state in epoch ``e`` keeps its position.
    - ``epoch_of``: where the epoch comes from for a framework that never calls ``set_epoch``
      (Lightning: the trainer's current epoch), read when a pass starts.
    - ``convert``: what each :class:`Batch` becomes (a collator's dict, tensors on a device).
    """

    def __init__(
        self,
        loader: LoaderBase,
        *,
        num_workers: int = 0,
        convert: Callable[[Batch], Any] | None = None,
        gather: bool = True,
        epoch_of: Callable[[], int] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if not isinstance(loader, LoaderBase):
            raise TypeError(
                "expected a shardstream.ShardLoader, TextLoader or NaFlexBudgetLoader, "
                f"got {type(loader).__name__}"
            )
        self.loader = loader
        self.num_workers = int(num_workers)
        self._batches: Any = loader
        if num_workers > 0:
            self._batches = loader.dataloader(num_workers, **dataloader_kwargs)
        self.convert = convert
        self.gather = gather
        self.epoch_of = epoch_of
        # The last state_dict() made (a collective when gathered): a framework that saves it a
        # second time in the same checkpoint reads it here instead of gathering again.
        self.last_state: dict[str, Any] | None = None

    def __len__(self) -> int:
        if self.epoch_of is not None:
            self.loader.set_epoch(self.epoch_of())  # keeps a loaded position in that epoch
        return self.loader.batches_per_epoch

    def pass_batches(self, epoch: int) -> int:
        """The batches a pass of ``epoch`` yields from where the loader stands: after a resume in
        that epoch, those left; else a whole epoch at this world size. Sets the epoch (a loaded
        position in it is kept)."""
        self.loader.set_epoch(epoch)
        return len(self.loader)

    def whole_epoch_batches(self) -> int:
        """The batches of a whole epoch at this world size (every epoch after a resumed one)."""
        return self.loader.batches_per_whole_epoch

    @property
    def epoch(self) -> int:
        """The epoch being read (after ``load_state_dict``: the loaded state's)."""
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        self.last_state = self.loader.state_dict(gather=self.gather)
        return self.last_state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        if self.epoch_of is not None:
            self.loader.set_epoch(self.epoch_of())
        for batch in self._batches:
            yield batch if self.convert is None else self.convert(batch)


def check_rank(loader: LoaderBase, rank: int, world_size: int, framework: str) -> None:
    """The loader must read this process's share: one clear error where it would read another's."""
    if (loader.rank, loader.world_size) != (rank, world_size):
        raise ValueError(
            f"the ShardLoader reads the share of rank {loader.rank} of {loader.world_size}, but {framework} "
            f"runs this process as rank {rank} of {world_size}: make the loader after the process group is "
            "initialised, or pass rank= and world_size= to match"
        )
