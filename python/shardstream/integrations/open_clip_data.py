"""open_clip_train's ``get_data``, answered by shardstream: the "train" and "val" DataInfo.

open_clip_train's loop reads ``images, texts = batch`` and moves both to the device; it calls
``data["train"].set_epoch(epoch)`` (through ``DataInfo.shared_epoch``) and reads
``dataloader.num_batches`` and ``num_samples``. :class:`OpenClipBatches` gives it exactly that
from a :class:`shardstream.ShardLoader`: images decoded and cropped by the loader's Rust threads,
normalised on the device with the model's mean and std (only uint8 crosses PCIe), captions
tokenized in the loader by open_clip's own BPE (token-identical), exact epochs from the index.

How open_clip_train's data flags map (one line refuses what has no equivalent):

* ``--train-data A::B`` with ``--train-index IA::IB``: one index per ``::`` part makes a mixture
  (one :class:`shardstream.Source` each); one index for all parts reads them as one dataset.
* ``--dataset-resampled`` (open_clip draws shards with replacement) becomes an exact mixture epoch:
  every source read without replacement, each batch holding the sources in proportion.
* ``--train-data-upsampling-factors F1::F2`` (open_clip: a weight per shard, so a source's share
  is its factor times its size) gives source i the weight ``Fi x its valid samples``.
* ``--train-num-samples N`` is the epoch length: with an index it makes a mixture epoch of N
  samples (a source continues where it stopped in the next epoch); without one it is the
  ``samples_per_epoch`` of shard-level streaming (exactness off, as in open_clip).
* ``--workers N`` is the loader's decode threads per rank (no worker processes are needed).
* ``--aug-cfg scale=(a, b)`` is the random crop's scale range; other augmentations run in
  open_clip's PIL transforms, which the adapter replaces, so they are refused.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardstream.errors import ShardError

if TYPE_CHECKING:
    import torch
# torch is imported where it is used: the flags are checked, and refused, before it loads.

log = logging.getLogger("shardstream.integrations.open_clip")


class OpenClipUsageError(ValueError):
    """A flag combination the adapter cannot honour; the message is one line naming the flag."""


@dataclass(frozen=True)
class ImageSpec:
    """What open_clip's transform would produce: square size, crop scale range, normalisation."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    scale: tuple[float, float] | None  # RandomResizedCrop's range (train); None: center crop


def image_spec(preprocess: Any, *, which: str) -> ImageSpec:
    """Reads size, crop and normalisation from open_clip's torchvision transform (the model's
    preprocess config after ``--force-image-size``, ``--image-mean``, ``--image-std``)."""
    from torchvision import transforms as T

    steps = list(getattr(preprocess, "transforms", []))
    normalise = next((s for s in steps if isinstance(s, T.Normalize)), None)
    crop = next((s for s in steps if isinstance(s, (T.RandomResizedCrop, T.CenterCrop))), None)
    if normalise is None or crop is None:
        raise OpenClipUsageError(
            f"the model's {which} transform is not open_clip's crop + Normalize (timm augmentation "
            "via --aug-cfg use_timm?): the adapter reproduces only that one"
        )
    height, width = crop.size if isinstance(crop.size, (tuple, list)) else (crop.size, crop.size)
    if height != width:
        raise OpenClipUsageError(f"--force-image-size {height} {width}: the loader makes square images only")
    scale = tuple(float(s) for s in crop.scale) if isinstance(crop, T.RandomResizedCrop) else None
    return ImageSpec(
        int(height),
        tuple(float(m) for m in normalise.mean),  # type: ignore[arg-type]
        tuple(float(s) for s in normalise.std),  # type: ignore[arg-type]
        scale,  # type: ignore[arg-type]
    )


SUPPORTED_AUG = {"scale"}


def check_aug_cfg(aug_cfg: dict[str, Any]) -> None:
    extra = sorted(set(aug_cfg) - SUPPORTED_AUG)
    if extra:
        raise OpenClipUsageError(
            f"--aug-cfg {' '.join(extra)}: open_clip applies it in the PIL transforms the adapter replaces; "
            "only scale=(a, b), the random crop's range, is supported"
        )


@dataclass(frozen=True)
class TrainSelection:
    """What ``ShardLoader`` is given for the training data."""

    urls: str | None
    index: str | None
    sources: list[Any] | None
    samples_per_epoch: int | None
    note: str  # one line for the log: how the flags were mapped


def split_parts(value: str | None) -> list[str]:
    return value.split("::") if value else []


def train_selection(args: Any, train_index: str | None) -> TrainSelection:
    """Maps --train-data, --train-index, --dataset-resampled, --train-data-upsampling-factors and
    --train-num-samples onto a plain loader or a mixture (see the module docstring)."""
    from shardstream import Source
    from shardstream.index import load_index

    parts, indexes = split_parts(args.train_data), split_parts(train_index)
    factors_arg = args.train_data_upsampling_factors
    resampled = bool(args.dataset_resampled)
    if factors_arg is not None and not resampled:
        raise OpenClipUsageError(
            "--train-data-upsampling-factors needs --dataset-resampled, as in open_clip_train"
        )
    if not indexes:
        if resampled:
            raise OpenClipUsageError(
                "--dataset-resampled maps onto an exact mixture epoch, which needs --train-index "
                "(one per '::' part of --train-data; build them with `shardstream index`)"
            )
        if args.train_num_samples is None:
            raise OpenClipUsageError(
                "without --train-index, --train-num-samples is needed (equal batches on every rank); "
                "or build an index with `shardstream index` for exact epochs"
            )
        return TrainSelection(
            args.train_data, None, None, args.train_num_samples, "no index: shard-level streaming, not exact"
        )
    if len(indexes) == 1:
        if factors_arg is not None and len(split_parts(factors_arg)) > 1:
            raise OpenClipUsageError(
                "--train-data-upsampling-factors weighs sources: give one index per '::' part of "
                "--train-data (--train-index 'IA::IB')"
            )
        how = "--dataset-resampled: exact epochs" if resampled else "exact epochs"
        if args.train_num_samples is None:
            return TrainSelection(args.train_data, indexes[0], None, None, f"{how} over the index")
        sources = [Source(index=indexes[0], urls=args.train_data, name="train")]
        return TrainSelection(
            None, None, sources, args.train_num_samples,
            f"{how} of --train-num-samples {args.train_num_samples} samples",
        )  # fmt: skip
    if len(indexes) != len(parts):
        raise OpenClipUsageError(
            f"--train-index has {len(indexes)} '::' parts and --train-data {len(parts)}: "
            "give one index per source (or one index for all of them, without --dataset-resampled)"
        )
    factors = [1.0] * len(parts)
    if factors_arg is not None:
        try:
            factors = [float(f) for f in split_parts(factors_arg)]
        except ValueError:
            raise OpenClipUsageError(
                f"--train-data-upsampling-factors {factors_arg!r}: expected numbers separated by '::'"
            ) from None
        if len(factors) != len(parts):
            raise OpenClipUsageError(
                f"--train-data-upsampling-factors has {len(factors)} '::' parts and --train-data {len(parts)}"
            )
        if not all(math.isfinite(f) and f > 0 for f in factors):
            raise OpenClipUsageError(f"--train-data-upsampling-factors {factors_arg!r}: each must be > 0")
    sources = []
    for i, (urls, index, factor) in enumerate(zip(parts, indexes, factors, strict=True)):
        # open_clip weighs each shard: a source's share is its factor times its size.
        size = load_index(index).num_valid
        sources.append(Source(index=index, urls=urls, weight=factor * size, name=f"source{i}"))
    how = "--dataset-resampled: an exact mixture epoch" if resampled else "a mixture of the sources"
    return TrainSelection(None, None, sources, args.train_num_samples, f"{how} (weights: factor x size)")


def loader_tokenizer(args: Any) -> str | None:
    """The model name for the loader's Rust tokenizer, or None when it cannot reproduce the
    model's tokenizer (not open_clip's CLIP BPE, or --force-context-length): open_clip's own
    tokenizer then runs on the captions, in Python."""
    from shardstream.tokenizer import resolve_tokenizer

    if args.force_context_length is not None:
        return None
    try:
        resolve_tokenizer(args.model)
    except (ValueError, RuntimeError, ImportError, OSError):
        return None
    return args.model


class LoaderEpoch:
    """Stands in for open_clip_train's ``SharedEpoch``: ``DataInfo.set_epoch`` calls
    :meth:`set_value`, which sets the loader's epoch and then, for the epoch a checkpoint was
    taken in, restores the loader's position in it."""

    def __init__(self, loader: Any, epoch: int, resume: dict[str, Any] | None) -> None:
        self.loader = loader
        self.epoch = epoch
        self.resume = resume  # {"epoch", "batches", "loader"}: a mid-epoch checkpoint's position
        self.set_value(epoch)

    def resume_offset(self, epoch: int) -> int:
        """Batches of ``epoch`` already trained before the checkpoint (0 for a fresh epoch)."""
        if self.resume is not None and int(self.resume["epoch"]) == epoch:
            return int(self.resume["batches"])
        return 0

    def set_value(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.loader.set_epoch(self.epoch)
        if self.resume_offset(self.epoch):
            assert self.resume is not None
            self.loader.load_state_dict(self.resume["loader"])

    def get_value(self) -> int:
        return self.epoch

    def finish_resume(self) -> None:
        """The resumed epoch has been trained: later epochs start from their beginning."""
        self.resume = None


@dataclass
class OpenClipBatches:
    """What open_clip_train's loop iterates: ``(normalised float images on the device, int64
    tokens)`` per batch, with ``num_batches`` and ``num_samples`` as its DataInfo carries them."""

    loader: Any
    device: torch.device
    spec: ImageSpec
    tokenize: Callable[[list[str]], torch.Tensor]
    num_batches: int
    num_samples: int
    epoch: LoaderEpoch | None = None  # train only
    keys_log: str | None = None  # a folder: each rank appends its batches' keys (JSONL)
    rank: int = 0
    #: called with the batches done in the epoch when the loop asks for the next one (its step done)
    after_step: Callable[[int], None] | None = None
    _mean: torch.Tensor | None = field(default=None, init=False, repr=False)
    _std: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        return self.num_batches

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, S, S] -> float32 on the device, (x / 255 - mean) / std as ToTensor and
        Normalize compute it; the division happens there, so only uint8 crosses PCIe."""
        import torch

        if self._mean is None:
            self._mean = torch.tensor(self.spec.mean, device=self.device).view(1, 3, 1, 1)
            self._std = torch.tensor(self.spec.std, device=self.device).view(1, 3, 1, 1)
        x = images.to(self.device, non_blocking=True).float().div_(255.0)
        return x.sub_(self._mean).div_(self._std)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch.epoch if self.epoch is not None else 0
        done = self.epoch.resume_offset(epoch) if self.epoch is not None else 0
        keys_file = self._open_keys_log()
        batches: Generator[Any, None, None] = iter(self.loader)
        try:
            for n in itertools.count():
                # The loop asks for batch n once step n - 1 is done; the loader has then yielded n
                # batches, so its state_dict() is the position after them.
                if n and self.after_step is not None:
                    self.after_step(done + n)
                batch = next(batches, None)
                if batch is None:
                    break
                tokens = batch.tokens if batch.tokens is not None else self.tokenize(list(batch.texts))
                if keys_file is not None:
                    keys_file.write(
                        json.dumps({"epoch": epoch, "batch": done + n, "keys": batch.keys}) + "\n"
                    )
                    keys_file.flush()
                yield self.normalise(batch.images), tokens
        finally:
            batches.close()  # the Rust pipeline stops now, not when the generator is collected
            if keys_file is not None:
                keys_file.close()
            if self.epoch is not None:
                self.epoch.finish_resume()

    def _open_keys_log(self) -> Any:
        if self.keys_log is None or self.epoch is None:
            return None
        os.makedirs(self.keys_log, exist_ok=True)
        return open(os.path.join(self.keys_log, f"rank-{self.rank}.jsonl"), "a", encoding="utf-8")


@dataclass(frozen=True)
class AdapterOptions:
    """The adapter's own flags (removed before open_clip_train parses the rest)."""

    train_index: str | None = None
    val_index: str | None = None
    save_every_n_steps: int = 0
    sample_keys_log: str | None = None
    shuffle_buffer: int | None = None


def _open_loader(flag: str, **kwargs: Any) -> Any:
    """A ShardLoader, with a failure to open the shards reported as one line naming the flag."""
    from shardstream import ShardLoader

    try:
        return ShardLoader(**kwargs)
    except (ShardError, ValueError, OSError) as e:
        raise OpenClipUsageError(f"{flag}: cannot open the shards: {e}") from None


def check_flags(args: Any, options: AdapterOptions) -> None:
    """Refuses, with one line, what the adapter cannot honour: called on open_clip_train's parsed
    flags before it starts (no model is built for a command that would fail), and again in get_data."""
    if args.dataset_type not in ("auto", "webdataset"):
        raise OpenClipUsageError(
            f"--dataset-type {args.dataset_type}: the adapter reads WebDataset shards; "
            "run open_clip_train.main itself for this one"
        )
    check_aug_cfg(dict(args.aug_cfg or {}))
    if args.train_data:
        train_selection(args, options.train_index)


def get_data(
    args: Any,
    preprocess_fns: tuple[Any, Any],
    epoch: int,
    tokenizer: Callable[[list[str]], torch.Tensor],
    options: AdapterOptions,
    resume: dict[str, Any] | None,
) -> dict[str, Any]:
    """open_clip_train.data.get_data with shardstream in place of webdataset for "train" and
    "val"; ImageNet zero-shot sets (``--imagenet-val``/``--imagenet-v2``) stay open_clip's own."""
    import torch
    from open_clip_train.data import DataInfo, get_imagenet

    from shardstream import DEFAULTS

    check_flags(args, options)
    device = torch.device(args.device)
    tokens_in_loader = loader_tokenizer(args)
    threads = max(1, int(args.workers))
    shuffle_buffer = options.shuffle_buffer or DEFAULTS.shuffle_buffer
    data: dict[str, Any] = {}
    if args.train_data:
        spec = image_spec(preprocess_fns[0], which="train")
        selection = train_selection(args, options.train_index)
        loader = _open_loader(
            "--train-data",
            urls=selection.urls,
            index=selection.index,
            sources=selection.sources,
            samples_per_epoch=selection.samples_per_epoch,
            batch_size=args.batch_size,
            image_size=spec.size,
            seed=args.seed,
            shuffle_buffer=shuffle_buffer,
            threads=threads,
            rank=args.rank,
            world_size=args.world_size,
            drop_last=True,  # every rank takes the same number of full steps
            crop="random",
            random_crop_scale=spec.scale or DEFAULTS.random_crop_scale,
            tokenizer=tokens_in_loader,
        )
        # A whole epoch's batches on this world size (what open_clip_train's schedule counts),
        # before the checkpoint's position is applied: len() after it counts only what is left.
        loader.set_epoch(epoch)
        num_batches = len(loader)
        position = LoaderEpoch(loader, epoch, resume)
        batches = OpenClipBatches(
            loader, device, spec, tokenizer, num_batches, num_batches * args.batch_size * args.world_size,
            epoch=position, keys_log=options.sample_keys_log, rank=args.rank,
        )  # fmt: skip
        data["train"] = DataInfo(dataloader=batches, shared_epoch=position)
        if args.rank == 0:
            log.info(
                "shardstream: train data %s; %d batches of %d per rank per epoch, %s tokens",
                selection.note, num_batches, args.batch_size, "loader" if tokens_in_loader else "Python",
            )  # fmt: skip
    if args.val_data:
        data["val"] = DataInfo(dataloader=_val_batches(args, preprocess_fns[1], options, tokenizer, threads))
    if args.imagenet_val is not None:
        data["imagenet-val"] = get_imagenet(args, preprocess_fns, "val")
    if args.imagenet_v2 is not None:
        data["imagenet-v2"] = get_imagenet(args, preprocess_fns, "v2")
    return data


def _val_batches(
    args: Any,
    preprocess: Any,
    options: AdapterOptions,
    tokenizer: Callable[[list[str]], torch.Tensor],
    threads: int,
) -> OpenClipBatches:
    """open_clip_train evaluates on rank 0 alone: one reader of every held-out sample once, in
    order, center-cropped, the last batch partial."""
    import torch

    from shardstream.index import load_index

    spec = image_spec(preprocess, which="val")
    loader = _open_loader(
        "--val-data",
        urls=args.val_data,
        index=options.val_index,
        batch_size=args.batch_size,
        image_size=spec.size,
        seed=0,
        shuffle_buffer=1,
        threads=threads,
        rank=0,
        world_size=1,
        drop_last=False,
        crop="center",
        tokenizer=loader_tokenizer(args),
    )
    if options.val_index is not None:
        num_samples = load_index(options.val_index).num_valid
    else:
        num_samples = args.val_num_samples or 0  # open_clip's convention: unknown, read to the end
    return OpenClipBatches(
        loader,
        torch.device(args.device),
        spec,
        tokenizer,
        math.ceil(num_samples / args.batch_size),
        num_samples,
    )
