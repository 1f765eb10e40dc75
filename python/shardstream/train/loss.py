"""The contrastive loss across ranks, and gradient accumulation that is exact for it.

A contrastive loss couples every sample with every other one in the batch (they are each other's
negatives), so averaging the losses of k small batches is *not* the loss of one batch k times as
large. ``contrastive_backward`` instead follows open_clip's ``accum_freq`` scheme:

1. compute the features of all k micro-batches without a graph (cheap on memory);
2. for each micro-batch j, recompute its features with a graph and back-propagate the loss of the
   whole k*m batch, in which micro-batch j is live and the others are the cached constants.

The loss is the same function of the features in every pass, so the k backward passes add up to
exactly the gradient of one big batch: pass j contributes dL/df_j * df_j/dtheta. One detail makes
it exact for the temperature as well: the logit scale is live in one pass only (the last), so its
gradient is counted once, not k times.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

# open_clip 3.3 gathers with torch.distributed.nn.all_gather, which torch 2.15 marks deprecated
# (still correct, and the documented way to gather with gradients): not the user's concern.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated", category=FutureWarning
)


def make_clip_loss(rank: int, world_size: int) -> torch.nn.Module:
    """open_clip's ClipLoss with features gathered across ranks with their gradients, each rank
    computing the loss of its own rows against all columns (local_loss): the same gradient as
    the full global loss, at 1/W of the logits memory."""
    from open_clip import ClipLoss

    return ClipLoss(
        local_loss=True, gather_with_grad=True, cache_labels=True, rank=rank, world_size=world_size
    )


def _features(model: torch.nn.Module, images: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    out = model(images, tokens)
    return out["image_features"], out["text_features"], out["logit_scale"]


def contrastive_backward(
    model: torch.nn.Module,
    loss_fn: torch.nn.Module,
    micro_batches: Sequence[tuple[Tensor, Tensor]],
    *,
    autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
    scale: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Back-propagates the contrastive loss of the concatenation of ``micro_batches`` (each a pair
    of normalised images and tokens) into ``.grad``; returns the loss (detached, unscaled).

    ``scale``: fp16's loss scaling (``GradScaler.scale``), applied to the loss of every pass. The
    scale does not change within a step, so the passes still add up to the big batch's gradient,
    times the scale, which ``GradScaler.unscale_`` divides out once.

    With DistributedDataParallel, gradients are all-reduced once, on the last pass (``no_sync``
    for the others)."""

    def backward(loss: Tensor) -> None:
        (scale(loss) if scale is not None else loss).backward()

    if not micro_batches:
        raise ValueError("contrastive_backward needs at least one micro-batch")
    if len(micro_batches) == 1:
        images, tokens = micro_batches[0]
        with autocast():
            image_features, text_features, logit_scale = _features(model, images, tokens)
            loss = loss_fn(image_features, text_features, logit_scale)
        backward(loss)
        return loss.detach()

    with torch.no_grad(), autocast():
        cached = [_features(model, images, tokens)[:2] for images, tokens in micro_batches]
    no_sync = getattr(model, "no_sync", nullcontext)
    last = len(micro_batches) - 1
    loss = torch.zeros(())
    for j, (images, tokens) in enumerate(micro_batches):
        with nullcontext() if j == last else no_sync():
            with autocast():
                image_j, text_j, logit_scale = _features(model, images, tokens)
                if j != last:
                    logit_scale = logit_scale.detach()
                image_features = torch.cat([image_j if i == j else c[0] for i, c in enumerate(cached)])
                text_features = torch.cat([text_j if i == j else c[1] for i, c in enumerate(cached)])
                loss = loss_fn(image_features, text_features, logit_scale)
            backward(loss)
    return loss.detach()
