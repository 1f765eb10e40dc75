"""Zero-shot classification on a labelled set in CLIP_benchmark's webdataset layout, across ranks.

The layout is the one ``clip_benchmark.datasets.builder.build_wds_dataset`` reads (LAION-AI/
CLIP_benchmark at commit 97cb1f1, the ``wds/...`` datasets on the Hugging Face hub)::

    ROOT/
        classnames.txt                          one class name per line, line i = class i
        zeroshot_classification_templates.txt   one prompt per line, {c} where the name goes
        test/
            nshards.txt                         the shard count n
            0.tar ... {n-1}.tar                 per sample an image (webp, png, jpg or jpeg)
                                                and ``cls``: the class index as text

ROOT is a local folder or an http(s):// or s3:// prefix. As in CLIP_benchmark, the two text files
are optional; a set without its own gets OpenAI's ImageNet class names and 80 templates (from
``open_clip.zero_shot_metadata``). The classifier is open_clip's ``build_zero_shot_classifier``:
per class the mean over templates of the normalised text features, normalised.

Each rank classifies its share of the shards (an exact split with an index, otherwise rank 0
reads them all); correct counts and totals are summed over ranks in one all-reduce, so every
sample counts once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from shardstream.train.config import Config, ConfigError
from shardstream.train.dist import DistContext, reduce_over_ranks
from shardstream.train.model import ModelBundle

CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"
NSHARDS_FILE = "nshards.txt"
LABEL_KEY = "cls"  # the member that holds a sample's class index
TOP_K = (1, 5)
READ_TIMEOUT_S = 60.0
CLASSES_PER_BATCH = 10  # class names encoded per text forward (x templates prompts)


@dataclass(frozen=True)
class ZeroShotSet:
    root: str
    classnames: list[str]
    templates: list[Callable[[str], str]]
    shards: list[str]
    index: str | None
    builtin: tuple[str, ...]  # which of classnames/templates came from open_clip's ImageNet metadata

    def describe(self) -> str:
        sizes = (len(self.classnames), len(self.templates), len(self.shards))
        parts = ["{} classes, {} templates, {} shards".format(*sizes)]
        if self.builtin:
            parts.append("built-in ImageNet " + " and ".join(self.builtin))
        return f"zero-shot set {self.root}: " + "; ".join(parts)


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def _read_text(where: str, what: str) -> str | None:
    """The file's text, or None where it does not exist; any other failure is a ConfigError."""
    from shardstream.errors import NotFoundError, ShardError
    from shardstream.index import _read_bytes
    from shardstream.urls import scheme_of

    if scheme_of(where) == "local" and not os.path.exists(where.removeprefix("file://")):
        return None
    try:
        data = _read_bytes(where, what, timeout=READ_TIMEOUT_S)
    except NotFoundError:
        return None
    except ShardError as e:
        raise ConfigError(f"eval.zeroshot: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"eval.zeroshot: {where} is not UTF-8 text") from None


def split_shards(root: str, split: str, count: int) -> list[str]:
    """The names CLIP_benchmark gives a split's shards: ``ROOT/SPLIT/0.tar`` ... ``{count-1}.tar``."""
    return [_join(root, split, f"{i}.tar") for i in range(count)]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _check_template(text: str, where: str, line: int) -> None:
    try:
        text.format(c="x")
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"eval.zeroshot: {where} line {line}: a template may hold only {{c}}, got {text!r} ({e})"
        ) from None
    if "{c}" not in text:
        raise ConfigError(f"eval.zeroshot: {where} line {line}: the template has no {{c}}: {text!r}")


def _format_c(template: str, classname: str) -> str:
    return template.format(c=classname)


def load_zeroshot_set(root: str, *, split: str = "test", index: str = "") -> ZeroShotSet:
    """The labelled set at ``root`` (checked: a bad file is one ConfigError naming it)."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    builtin: list[str] = []
    names_at = _join(root, CLASSNAMES_FILE)
    text = _read_text(names_at, "class names")
    if text is None:
        classnames = list(IMAGENET_CLASSNAMES)
        builtin.append("class names")
    else:
        classnames = _lines(text)
        if not classnames:
            raise ConfigError(f"eval.zeroshot: {names_at} holds no class names")
    templates_at = _join(root, TEMPLATES_FILE)
    text = _read_text(templates_at, "templates")
    templates: list[Callable[[str], str]]
    if text is None:
        templates = list(OPENAI_IMAGENET_TEMPLATES)
        builtin.append("templates")
    else:
        lines = _lines(text)
        if not lines:
            raise ConfigError(f"eval.zeroshot: {templates_at} holds no templates")
        for number, line in enumerate(lines, 1):
            _check_template(line, templates_at, number)
        templates = [partial(_format_c, line) for line in lines]
    count_at = _join(root, split, NSHARDS_FILE)
    text = _read_text(count_at, "shard count")
    if text is None:
        raise ConfigError(
            f"eval.zeroshot: {count_at} not found: a labelled set in CLIP_benchmark's layout has "
            f"{split}/{NSHARDS_FILE} and {split}/0.tar ... beside {CLASSNAMES_FILE}"
        )
    try:
        count = int(text.strip())
        if count < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"eval.zeroshot: {count_at} must hold a shard count >= 1, got {text.strip()!r}"
        ) from None
    shards = split_shards(root, split, count)
    return ZeroShotSet(root, classnames, templates, shards, index or None, tuple(builtin))


def zeroshot_loader(cfg: Config, zeroshot: ZeroShotSet, image_size: int, ctx: DistContext) -> Any:
    """The labelled set's samples, each once across ranks (``evaluation_loader``), with the
    ``cls`` member read as the text."""
    from shardstream.train.loaders import evaluation_loader

    return evaluation_loader(
        cfg, "eval.zeroshot", zeroshot.shards, zeroshot.index, image_size, ctx, caption_key=LABEL_KEY
    )


@torch.no_grad()
def zeroshot_classifier(
    bundle: ModelBundle,
    classnames: Sequence[str],
    templates: Sequence[Callable[[str], str]],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[object]],
) -> torch.Tensor:
    """``[embed_dim, classes]`` on ``device``: open_clip's own classifier construction."""
    from open_clip import build_zero_shot_classifier

    with autocast():
        weights = build_zero_shot_classifier(
            bundle.model,
            bundle.tokenizer,
            classnames,
            templates,
            num_classes_per_batch=CLASSES_PER_BATCH,
            device=device,
        )
    return weights.float()


def _labels(texts: Sequence[str], classes: int, keys: Sequence[str]) -> torch.Tensor:
    labels = []
    for text, key in zip(texts, keys, strict=True):
        try:
            label = int(text.strip())
        except ValueError:
            label = -1
        if not 0 <= label < classes:
            raise ConfigError(
                f"eval.zeroshot: sample {key!r}: {LABEL_KEY} must be a class index in [0, {classes}), "
                f"got {text!r}"
            )
        labels.append(label)
    return torch.tensor(labels, dtype=torch.int64)


@torch.no_grad()
def evaluate_zeroshot(
    bundle: ModelBundle,
    batches: Iterable[Any],
    zeroshot: ZeroShotSet,
    *,
    ctx: DistContext,
    autocast: Callable[[], AbstractContextManager[object]],
) -> dict[str, float]:
    """Top-1 and top-5 accuracy over the union of every rank's ``batches`` (a collective). The
    counts stay on the device until the one all-reduce at the end."""
    model = bundle.model
    was_training = model.training
    model.eval()
    classes = len(zeroshot.classnames)
    ks = [k for k in TOP_K if k <= classes]
    correct = torch.zeros(len(ks) + 1, dtype=torch.float64, device=ctx.device)  # ..., samples
    try:
        classifier = zeroshot_classifier(
            bundle, zeroshot.classnames, zeroshot.templates, ctx.device, autocast
        )
        for batch in batches:
            truth = _labels(list(batch.texts), classes, list(batch.keys)).to(ctx.device, non_blocking=True)
            images = bundle.normalise(batch.images, ctx.device)
            with autocast():
                features = model.encode_image(images, normalize=True)
            logits = features.float() @ classifier
            nearest = logits.topk(max(ks), dim=1).indices
            hit = nearest == truth[:, None]
            for i, k in enumerate(ks):
                correct[i] += hit[:, :k].any(dim=1).sum()
            correct[-1] += truth.shape[0]
    finally:
        model.train(was_training)
    totals = reduce_over_ranks(ctx, correct.cpu(), "sum").tolist()
    samples = totals[-1]
    metrics = {"zeroshot_samples": samples, "zeroshot_chance": 1.0 / classes}
    if samples:
        for i, k in enumerate(ks):
            metrics[f"zeroshot_top{k}"] = totals[i] / samples
    return metrics
