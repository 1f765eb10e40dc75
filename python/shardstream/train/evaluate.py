"""Held-out evaluation, computed across ranks: image-text retrieval recall@k and validation loss.

Each rank encodes its share of the held-out shards; features are gathered to every rank, on the
device where the backend allows it (NCCL; gloo gathers host tensors), and every rank computes the
same recall (so that every rank's callbacks see it without another collective).

Retrieval: a text counts as a match for an image when its caption is *identical* to the image's
own caption (and vice versa). With unique captions (web data) this is the usual recall@k; with
templated captions (the demo) it does not count an identical caption of another image as a miss.

Validation loss: the training loss (whatever the trainer uses) of each held-out batch of a rank,
``eval.batch_size`` samples against each other, averaged over all held-out samples of all ranks.
A rank's batches are its own: the ranks' shares differ in size, so the loss is not gathered across
ranks, and its value depends on ``eval.batch_size`` as a contrastive loss depends on its batch.

Zero-shot classification is ``shardstream.train.zeroshot``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from shardstream.train.dist import DistContext, reduce_over_ranks
from shardstream.train.loss import TrainLoss
from shardstream.train.model import ModelBundle

# From the model's outputs (a dict: image_features, text_features, logit_scale, ...) to a loss.
BatchLoss = Callable[[dict[str, Tensor]], Tensor]


def caption_id(caption: str) -> int:
    """A stable 63-bit id of a caption string (compared across ranks instead of the strings)."""
    return int.from_bytes(hashlib.blake2b(caption.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def rank_local_loss(loss_fn: TrainLoss) -> BatchLoss:
    """The trainer's loss of one rank's batch alone: the ranks' held-out shares differ in size, so
    a loss that gathers features across ranks would hang on them (``TrainLoss.rank_local``)."""
    return loss_fn.rank_local()


def gather_rows(ctx: DistContext, tensor: Tensor) -> Tensor:
    """Every rank's rows (counts may differ) in rank order, on ``tensor``'s device. NCCL gathers
    device tensors as they are; gloo gathers host copies."""
    if not ctx.distributed:
        return tensor
    comm = tensor.device if ctx.backend == "nccl" else torch.device("cpu")
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=comm)
    counts = [torch.empty_like(count) for _ in range(ctx.world_size)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in torch.cat(counts).tolist()]
    padded = torch.zeros((max(sizes), *tensor.shape[1:]), dtype=tensor.dtype, device=comm)
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]).to(tensor.device)


def _recall(
    query: Tensor, keys: Tensor, query_ids: Tensor, key_ids: Tensor, ks: list[int]
) -> dict[int, float]:
    """Fraction of queries whose top-k keys contain one with the same caption id; in row chunks
    so that memory stays bounded for large held-out sets."""
    hits = {k: 0 for k in ks}
    top = min(max(ks), keys.shape[0])
    for start in range(0, query.shape[0], 1024):
        sims = query[start : start + 1024] @ keys.T
        nearest = sims.topk(top, dim=1).indices  # [chunk, top]
        match = key_ids[nearest] == query_ids[start : start + 1024, None]
        for k in ks:
            hits[k] += int(match[:, :k].any(dim=1).sum())
    n = max(1, query.shape[0])
    return {k: hits[k] / n for k in ks}


@torch.no_grad()
def evaluate(
    bundle: ModelBundle,
    batches: Iterable[Any],
    *,
    ctx: DistContext,
    autocast: Callable[[], AbstractContextManager[object]],
    recall_k: list[int],
    loss_fn: BatchLoss | None = None,
) -> dict[str, float]:
    """Metrics over the union of every rank's ``batches`` (a collective: all ranks call it).
    ``loss_fn``: the loss of one batch from the model's outputs; None: no validation loss."""
    model = bundle.model
    was_training = model.training
    model.eval()
    device = ctx.device
    image_parts, text_parts, ids = [], [], []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # sum over samples of the batch loss
    try:
        for batch in batches:
            images = bundle.normalise(batch.images, device)
            tokens = getattr(batch, "tokens", None)
            tokens = (tokens if tokens is not None else bundle.tokenizer(list(batch.texts))).to(device)
            with autocast():
                out = model(images, tokens)
                if loss_fn is not None:
                    loss_sum += loss_fn(out).double() * images.shape[0]
            image_parts.append(out["image_features"].float())
            text_parts.append(out["text_features"].float())
            ids.extend(caption_id(t) for t in batch.texts)
        if image_parts:
            dim = image_parts[0].shape[1]
        else:  # this rank got no held-out samples: it still needs the feature width to pad
            with autocast():
                dim = model.encode_text(bundle.tokenizer([""]).to(device)).shape[-1]
    finally:
        model.train(was_training)

    def joined(parts: list[Tensor]) -> Tensor:
        return torch.cat(parts) if parts else torch.zeros((0, dim), device=device)

    image_features = gather_rows(ctx, joined(image_parts))
    text_features = gather_rows(ctx, joined(text_parts))
    caption_ids = gather_rows(ctx, torch.tensor(ids, dtype=torch.int64, device=device))

    n = image_features.shape[0]
    metrics: dict[str, float] = {"samples": float(n)}
    if loss_fn is not None:
        local = torch.stack([loss_sum, torch.tensor(float(len(ids)), dtype=torch.float64, device=device)])
        total_loss, total_samples = reduce_over_ranks(ctx, local.cpu(), "sum").tolist()
        if total_samples:
            metrics["val_loss"] = total_loss / total_samples
    if n == 0:
        return metrics
    i2t = _recall(image_features, text_features, caption_ids, caption_ids, recall_k)
    t2i = _recall(text_features, image_features, caption_ids, caption_ids, recall_k)
    for k in recall_k:
        metrics[f"image_to_text_R@{k}"] = i2t[k]
        metrics[f"text_to_image_R@{k}"] = t2i[k]
    return metrics
