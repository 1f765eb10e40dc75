"""A LightningDataModule whose training loader is stateful (Lightning's ``_Stateful``: it has
``state_dict`` / ``load_state_dict``), so ``Trainer.fit(ckpt_path=...)`` resumes mid-epoch at the
exact next batch instead of restarting the epoch.

    datamodule = ShardDataModule(lambda: ShardLoader(urls, index=index, batch_size=256))
    trainer = lightning.Trainer(strategy="ddp", max_epochs=4, callbacks=[ModelCheckpoint(...)])
    trainer.fit(model, datamodule=datamodule, ckpt_path="last")

The loader is made in ``train_dataloader()`` (in each rank, after the process group is up) by the
given callable, or given made. Lightning never calls ``set_epoch`` on a loader that is not a torch
DataLoader, so the epoch is read from ``trainer.current_epoch`` when each pass starts. Its
``len()`` is a whole epoch, which is also what keeps Lightning's fetcher from reading a batch
ahead of the step (it pre-fetches only iterables of unknown length): the state saved at step n
is that of the n batches trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardstream.integrations import require
from shardstream.integrations._stateful import FrameworkLoader, check_rank
from shardstream.loader import Batch, ShardLoader

lightning = require("lightning", "lightning", "lightning")

__all__ = ["ShardDataModule"]


class ShardDataModule(lightning.LightningDataModule):
    """Training batches from a :class:`ShardLoader` (``loader``: one, or a callable that makes
    this rank's), read in the training process or by ``num_workers`` DataLoader workers,
    ``convert`` applied to each batch. Its state is saved in Lightning's checkpoints (gathered
    across ranks in Lightning's checkpoint dump, which every rank runs) and restored by
    ``fit(ckpt_path=...)``; on another world size the rest of the epoch is re-planned.

    Args:
        loader: This rank's :class:`~shardstream.ShardLoader`, or a callable that makes it
            (called in ``train_dataloader()``, after Lightning set up the process group).
        num_workers: DataLoader worker processes (default 0: in the training process).
        convert: ``fn(batch)`` applied to each batch. None (default): the batch itself.
        **dataloader_kwargs: Passed to :meth:`ShardLoader.dataloader` with workers.
    """

    def __init__(
        self,
        loader: ShardLoader | Callable[[], ShardLoader],
        *,
        num_workers: int = 0,
        convert: Callable[[Batch], Any] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        super().__init__()
        self._loader = loader
        self._num_workers = num_workers
        self._convert = convert
        self._dataloader_kwargs = dataloader_kwargs
        self._view: FrameworkLoader | None = None

    def train_dataloader(self) -> FrameworkLoader:
        """The training loader, made on first call (Lightning calls it on every rank).

        Returns:
            A stateful iterable of batches whose ``len()`` is a whole epoch.

        Raises:
            ValueError: The loader reads another rank's share than Lightning's process.
        """
        if self._view is None:
            loader = self._loader if isinstance(self._loader, ShardLoader) else self._loader()
            trainer = self.trainer
            if trainer is not None:
                check_rank(loader, trainer.global_rank, trainer.world_size, "lightning.Trainer")
            self._view = FrameworkLoader(
                loader,
                num_workers=self._num_workers,
                convert=self._convert,
                epoch_of=self._current_epoch,
                **self._dataloader_kwargs,
            )
        return self._view

    def _current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else self._view.loader.epoch
