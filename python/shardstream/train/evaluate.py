"""Held-out evaluation, computed across ranks: image-text retrieval recall@k and zero-shot accuracy.

Each rank encodes its share of the held-out shards; features are gathered to every rank, which
then compute the same metrics (so every rank's callbacks see them without another collective).

Retrieval: a text counts as a match for an image when its caption is *identical* to the image's
own caption (and vice versa). With unique captions (web data) this is the usual recall@k; with
templated captions (the demo) it does not count an identical caption of another image as a miss.

Zero-shot: the classes file maps class names to prompts. Each class is the normalised mean of
its prompts' text embeddings; an image whose caption is one of a class's prompts is labelled
with that class and must be nearest to it. Images with other captions are not counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from shardstream.train.dist import DistContext, all_gather_rows
from shardstream.train.model import ModelBundle


def caption_id(caption: str) -> int:
    """A stable 63-bit id of a caption string (compared across ranks instead of the strings)."""
    return int.from_bytes(hashlib.blake2b(caption.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def load_classes(path: str | Path) -> dict[str, list[str]]:
    """``{class name: [prompt, ...]}`` from a JSON file, checked."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"eval.zeroshot_classes: cannot read {path}: {e}") from None
    if (
        not isinstance(data, dict)
        or not data
        or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(p, str) for p in v)
            for k, v in data.items()
        )
    ):
        raise ValueError(f"eval.zeroshot_classes: {path} must map class names to non-empty lists of prompts")
    return data


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
def encode_classes(
    bundle: ModelBundle,
    classes: dict[str, list[str]],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[object]],
) -> Tensor:
    model = bundle.model
    rows = []
    with autocast():
        for prompts in classes.values():
            text = F.normalize(model.encode_text(bundle.tokenizer(prompts).to(device)).float(), dim=-1)
            rows.append(F.normalize(text.mean(dim=0), dim=-1))
    return torch.stack(rows).cpu()


@torch.no_grad()
def evaluate(
    bundle: ModelBundle,
    batches: Iterable[Any],
    *,
    ctx: DistContext,
    autocast: Callable[[], AbstractContextManager[object]],
    recall_k: list[int],
    classes: dict[str, list[str]] | None,
) -> dict[str, float]:
    """Metrics over the union of every rank's ``batches`` (a collective: all ranks call it)."""
    model = bundle.model
    was_training = model.training
    model.eval()
    image_parts, text_parts, ids = [], [], []
    try:
        for batch in batches:
            images = bundle.normalise(batch.images, ctx.device)
            tokens = bundle.tokenizer(list(batch.texts)).to(ctx.device)
            with autocast():
                image_parts.append(F.normalize(model.encode_image(images).float(), dim=-1).cpu())
                text_parts.append(F.normalize(model.encode_text(tokens).float(), dim=-1).cpu())
            ids.extend(caption_id(t) for t in batch.texts)
        class_features = encode_classes(bundle, classes, ctx.device, autocast) if classes else None
        if image_parts:
            dim = image_parts[0].shape[1]
        else:  # this rank got no held-out samples: it still needs the feature width to pad
            with autocast():
                dim = model.encode_text(bundle.tokenizer([""]).to(ctx.device)).shape[-1]
    finally:
        model.train(was_training)

    empty = torch.zeros((0, dim))
    image_features = all_gather_rows(ctx, torch.cat(image_parts) if image_parts else empty)
    text_features = all_gather_rows(ctx, torch.cat(text_parts) if text_parts else empty)
    caption_ids = all_gather_rows(ctx, torch.tensor(ids, dtype=torch.int64))

    n = image_features.shape[0]
    metrics: dict[str, float] = {"samples": float(n)}
    if n == 0:
        return metrics
    i2t = _recall(image_features, text_features, caption_ids, caption_ids, recall_k)
    t2i = _recall(text_features, image_features, caption_ids, caption_ids, recall_k)
    for k in recall_k:
        metrics[f"image_to_text_R@{k}"] = i2t[k]
        metrics[f"text_to_image_R@{k}"] = t2i[k]

    if classes and class_features is not None:
        label_of = {caption_id(p): label for label, prompts in enumerate(classes.values()) for p in prompts}
        labels = torch.tensor([label_of.get(int(c), -1) for c in caption_ids.tolist()], dtype=torch.int64)
        labelled = labels >= 0
        metrics["zeroshot_samples"] = float(labelled.sum())
        if labelled.any():
            logits = image_features[labelled] @ class_features.T
            truth = labels[labelled]
            metrics["zeroshot_top1"] = float((logits.argmax(dim=1) == truth).float().mean())
            if class_features.shape[0] >= 5:
                top5 = logits.topk(5, dim=1).indices
                metrics["zeroshot_top5"] = float((top5 == truth[:, None]).any(dim=1).float().mean())
            metrics["zeroshot_chance"] = 1.0 / class_features.shape[0]
    return metrics
