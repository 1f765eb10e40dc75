"""A ShardLoader in a plain accelerate loop: each rank reads its own exact share (nothing is
dispatched from rank 0 or split), batches land on ``accelerator.device``, and the loader's
position is saved and restored with ``accelerator.save_state`` / ``load_state``.

    loader = shardstream.integrations.accelerate.prepare(accelerator, ShardLoader(...))
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(checkpoint)          # when resuming: the loader's position too
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)                 # keeps a just-loaded position in its epoch
        for batch in loader: ...
        accelerator.save_state(folder)          # every rank calls it, as accelerate requires

The returned loader is not a torch DataLoader, so ``accelerator.prepare`` leaves it alone if it is
passed along: accelerate's DataLoaderShard would read one batch ahead of the step and its
DataLoaderDispatcher would send rank 0's batches to every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardstream.integrations import require
from shardstream.integrations._stateful import FrameworkLoader, check_rank
from shardstream.loader import Batch, ShardLoader

require("accelerate", "accelerate", "hf")

__all__ = ["prepare", "to_device"]


def to_device(batch: Batch, device: Any) -> Batch:
    """A copy of ``batch`` with its tensors moved (copies from pinned memory do not block).

    Args:
        batch: A :class:`~shardstream.Batch`.
        device: Where to (a ``torch.device`` or its name, e.g. ``accelerator.device``).

    Returns:
        The batch with ``images`` (and ``tokens``) on ``device``.
    """
    tokens = batch.tokens.to(device, non_blocking=True) if batch.tokens is not None else None
    return batch._replace(images=batch.images.to(device, non_blocking=True), tokens=tokens)


def prepare(
    accelerator: Any,
    loader: ShardLoader,
    *,
    num_workers: int = 0,
    convert: Callable[[Batch], Any] | None = None,
    **dataloader_kwargs: Any,
) -> FrameworkLoader:
    """``loader`` for ``accelerator``'s loop, registered for checkpointing.

    Its ``state_dict`` runs inside ``save_state`` on every rank (a collective that gathers the
    ranks' reserve use; accelerate writes rank 0's copy, identical on all) and ``load_state``
    gives every rank the saved position; on another world size the rest of the epoch is
    re-planned, each sample once.

    Args:
        accelerator: The ``accelerate.Accelerator`` of the run.
        loader: This rank's :class:`~shardstream.ShardLoader` (made after the process group is
            up, or with ``rank=``/``world_size=`` matching the accelerator's).
        num_workers: DataLoader worker processes reading it (default 0: in this process).
        convert: ``fn(batch)`` applied after the move to ``accelerator.device`` (e.g. into the
            model's input dict). None (default): the :class:`~shardstream.Batch` itself.
        **dataloader_kwargs: Passed to :meth:`ShardLoader.dataloader` with workers
            (``batch_transform=``, ``persistent_workers=`` ...).

    Returns:
        An iterable of batches on the device, with ``len()``, ``set_epoch``, ``state_dict`` and
        ``load_state_dict``.

    Raises:
        ValueError: The loader reads another rank's share than the accelerator's process.
    """
    check_rank(loader, accelerator.process_index, accelerator.num_processes, "accelerate")
    device = accelerator.device

    def placed(batch: Batch) -> Any:
        moved = to_device(batch, device)
        return moved if convert is None else convert(moved)

    view = FrameworkLoader(loader, num_workers=num_workers, convert=placed, **dataloader_kwargs)
    accelerator.register_for_checkpointing(view)
    return view
