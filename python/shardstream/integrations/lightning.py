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

Lightning reads ``len()`` when it sets its training data up, and by default only once per
``fit``. After a resume onto another world size the resumed epoch (steps done before the stop plus
the batches left) and the whole epochs after it have different lengths, so the module sets the
trainer's ``reload_dataloaders_every_n_epochs`` to 1: Lightning then asks ``len()`` again before
each epoch, and gets the length of the epoch it is about to run. Reloading costs nothing here: the
same loader is handed back, nothing is made again.

Lightning also caps an epoch at the length it reads before it restores the loader's state, and on
more ranks the resumed epoch (steps done on fewer ranks plus those left) can be longer than a
whole one. So the module keeps the loader's state in its own part of the checkpoint too (the
state the loop saved, not gathered again), and restores it into the loader as soon as the loader
is made, before Lightning asks for a length.
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
        # A loader state from the checkpoint being resumed, loaded when the loader is made.
        self._restored_state: dict[str, Any] | None = None

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
                # Every epoch's length read afresh (see the module docstring): without it, every
                # epoch after a resume onto fewer ranks stopped at the resumed epoch's length.
                trainer.reload_dataloaders_every_n_epochs = 1
            self._view = FrameworkLoader(
                loader,
                num_workers=self._num_workers,
                convert=self._convert,
                epoch_of=self._current_epoch,
                **self._dataloader_kwargs,
            )
            if self._restored_state is not None:
                self._view.load_state_dict(self._restored_state)
                self._restored_state = None
        return self._view

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as the training loop saved it in this checkpoint (nothing
        before the first save)."""
        if self._view is None or self._view.last_state is None:
            return {}
        return {"loader": self._view.last_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keeps the checkpoint's loader position for the loader made next (Lightning restores a
        data module before it sets its training data up).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        self._restored_state = state_dict.get("loader")

    def _current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else self._view.loader.epoch
