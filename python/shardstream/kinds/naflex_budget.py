"""Token-budget batches of the NaFlex kind: each batch holds as many images as fit a budget of
patches (``max_patches_per_batch``), grouped by length bucket so that padding stays low, with
exact epochs across ranks and workers.

Two steps, as for text corpora (a count, then a loader):

1. :func:`count_patches` reads every unit (a tar shard, a Parquet row group) once, decoding only
   image headers, and records how many batches its images make under the budget: a small JSON
   file (:class:`PatchCounts`), O(units).
2. :class:`NaFlexBudgetLoader` cuts the epoch's stream of batches (units in a seeded order) into
   equal shares per rank and DataLoader worker (``plan::unit_stream`` in the Rust core, a batch a
   position): every rank yields the same number of batches, every usable image is in exactly
   one batch per epoch (except the batches of the remainder, fewer than the world size, reported
   in ``stats``), and ``state_dict`` / ``load_state_dict`` continue at the exact next batch, also
   onto another world size or worker count.

How a unit's batches are made (``plan::budget``): images in file order go to length buckets
(upper bounds of patches per image, ``bucket_patches`` apart, the last ``max_num_patches``); a
batch of bucket k is ``[floor(budget / L_k), L_k]`` patches; a bucket that fills gives a batch,
and at the unit's end every non-empty bucket gives one shorter batch. Padding per image is under
one bucket width. Within a unit, images are grouped in file order (shards written in a random
order, as img2dataset writes them, mix well); the order of units is shuffled every epoch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from shardstream import _core
from shardstream._system import default_loader_threads
from shardstream.config import OnError, SourceOptions
from shardstream.errors import OptionError
from shardstream.kinds import counts_file
from shardstream.kinds.counting import CountingKind, count_units
from shardstream.kinds.naflex import NaFlex, NaFlexBatch, _core_spec
from shardstream.kinds.unit_plan import UnitPlanLoader

COUNTS_FORMAT = "shardstream-patch-counts"
COUNTS_VERSION = 1


def default_buckets(max_num_patches: int, bucket_patches: int | None) -> list[int]:
    """The length buckets: ascending bounds ``bucket_patches`` apart, the last
    ``max_num_patches``; default width: a sixty-fourth of the budget per image (at least 1): 4
    patches for 256, since the grid rule fills most images to within a few patches of the budget.

    Args:
        max_num_patches: The image budget.
        bucket_patches: The width, or None.

    Returns:
        The bounds.
    """
    step = bucket_patches if bucket_patches is not None else max(1, max_num_patches // 64)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise OptionError("bucket_patches", f"must be a positive integer, not {bucket_patches!r}")
    bounds = list(range(step, max_num_patches, step))
    return [*bounds, max_num_patches]


@dataclass
class PatchCounts(counts_file.BatchCounts):
    """How many token-budget batches every unit of an image dataset makes: what
    :class:`NaFlexBudgetLoader` plans an epoch with. Made by :func:`count_patches`; saved and
    loaded as JSON (gzip when the path ends in ``.gz``).

    Attributes:
        naflex: ``(patch_size, max_num_patches, min_num_patches)`` the grids were computed with.
        max_patches_per_batch: The budget of patches per batch.
        buckets: The length buckets' upper bounds.
        max_images_per_batch: The most images a batch holds.
        sample: The sample keys read: ``image_keys``, ``caption_key``, ``max_pixels``,
            ``max_member_bytes``.
        units: One dict per unit in dataset order: ``url``, ``display``, ``first_row``, ``rows``
            (None for a tar), ``identity``, ``version`` (as :class:`~shardstream.TokenCounts`'s),
            ``samples``, ``batches``, ``patches`` (of the usable
            images' grids), ``slots`` (patch slots of their batches), ``fixed_slots`` (the same
            images padded to ``max_num_patches``), ``skipped`` (reason to count).
        failed: Units that could not be read, with their ``error``: no epoch reads them.
    """

    naflex: tuple[int, int, int]
    max_patches_per_batch: int
    buckets: list[int]
    max_images_per_batch: int
    sample: dict[str, Any]
    units: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)

    FORMAT: ClassVar[str] = COUNTS_FORMAT
    VERSION: ClassVar[int] = COUNTS_VERSION
    WHAT: ClassVar[str] = "patch counts"

    def __post_init__(self) -> None:
        self.naflex = tuple(self.naflex)  # type: ignore[assignment]  # a list, read from JSON

    @property
    def images(self) -> int:
        """Usable images (skipped ones not counted)."""
        return self.samples - sum(self.skipped.values())

    @property
    def samples(self) -> int:
        """Samples read."""
        return self._sum("samples")

    @property
    def padding(self) -> float:
        """The fraction of patch slots that are padding in these batches."""
        return self._padding(self._sum("patches"), "slots")

    @property
    def fixed_count_padding(self) -> float:
        """The same fraction for fixed-count batches padded to ``max_num_patches`` (what
        ``ShardLoader(sample=NaFlex(...))`` yields)."""
        return self._padding(self._sum("patches"), "fixed_slots")

    def _identity_head(self) -> bytes:
        shape = [self.naflex, self.max_patches_per_batch, self.buckets, self.max_images_per_batch]
        return json.dumps([*shape, self.sample]).encode()


def _core_config(counts: PatchCounts) -> dict[str, Any]:
    patch_size, max_num_patches, min_num_patches = counts.naflex
    return {
        **counts.sample,
        "naflex": _core_spec(patch_size, max_num_patches, min_num_patches),
        "max_patches_per_batch": counts.max_patches_per_batch,
        "buckets": counts.buckets,
        "max_images_per_batch": counts.max_images_per_batch,
    }


def count_patches(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    naflex: NaFlex,
    max_patches_per_batch: int,
    bucket_patches: int | None = None,
    max_images_per_batch: int | None = None,
    image_keys: Sequence[str] | None = None,
    caption_key: str = "txt",
    max_pixels: int | None = None,
    threads: int | None = None,
    output: str | os.PathLike[str] | None = None,
    source: SourceOptions | None = None,
    on_error: OnError = "skip",
    previous: PatchCounts | str | os.PathLike[str] | None = None,
    distributed: bool = False,
) -> PatchCounts:
    """Counts the token-budget batches of every unit of an image-text dataset, once, for
    :class:`NaFlexBudgetLoader`.

    Every sample is read and judged exactly as the loader will (image present, caption present,
    header parses, pixels under ``max_pixels``, at least ``min_num_patches`` patches); only the
    image headers are decoded.

    Args:
        urls: Tar shards or Parquet files (as :class:`~shardstream.ShardLoader` takes them).
        naflex: The kind's spec: its ``patch_size``, ``max_num_patches`` and
            ``min_num_patches`` set every image's grid (its crop settings are the loader's).
        max_patches_per_batch: Patches a batch may hold, padding included: at least
            ``max_num_patches``.
        bucket_patches: Width of the length buckets in patches (default: ``max_num_patches //
            64``, 4 for 256): smaller gives less padding and more open buckets (memory: up to one batch of
            samples per bucket is held while reading).
        max_images_per_batch: The most images a batch holds (default: 4 x
            ``max_patches_per_batch // max_num_patches``, four times a batch of full-length
            images): without it a bucket of tiny images would make batches of thousands, and a
            reader holds up to one batch per bucket.
        image_keys: Image member extensions or Parquet columns, tried in order (default: the
            loader's).
        caption_key: The caption member or column (``json:FIELD`` for a JSON field; ``""``: no
            caption).
        max_pixels: Larger images are skipped (``too_many_pixels``); default: the loader's.
        threads: Threads reading (default: this process's share of the cores).
        output: If given, the counts are also saved there.
        source: How the files are fetched (S3 endpoint, cache, ...).
        on_error: A unit that cannot be read at all: ``"skip"`` (default) leaves it out of the
            counts (in :attr:`PatchCounts.failed`) and warns, an
            :class:`~shardstream.UnreadableUnitsWarning` naming each such unit and its reason;
            ``"raise"`` raises a :class:`~shardstream.ShardError` naming the first one (nothing
            is saved). As :func:`~shardstream.count_tokens`.
        previous: Counts of an earlier pass under the same settings (or their path): only new
            and changed files are read. As :func:`~shardstream.count_tokens`'s.
        distributed: Split the files across the ranks of a torchrun job, every rank returning
            the same counts. As :func:`~shardstream.count_tokens`'s.

    Returns:
        The counts.

    Raises:
        OptionError: a budget under one image of ``max_num_patches``, or bad buckets.
        ValueError: no file matches, or no image of any unit can be used (the message names the
            most common reason).
        ShardError: with ``on_error="raise"``, a unit could not be read.
    """
    from shardstream.config import DEFAULTS
    from shardstream.urls import expand_urls, source_config

    if not isinstance(naflex, NaFlex):
        raise OptionError("naflex", f"must be a shardstream.NaFlex, not {type(naflex).__name__}")
    if (
        isinstance(max_patches_per_batch, bool)
        or not isinstance(max_patches_per_batch, int)
        or max_patches_per_batch < naflex.max_num_patches
    ):
        raise OptionError(
            "max_patches_per_batch",
            f"must be an integer of at least max_num_patches={naflex.max_num_patches} (one image), "
            f"not {max_patches_per_batch!r}",
        )
    buckets = default_buckets(naflex.max_num_patches, bucket_patches)
    if max_images_per_batch is None:
        max_images_per_batch = 4 * (max_patches_per_batch // naflex.max_num_patches)
    counts_file.check_on_error(on_error)
    most = max_images_per_batch
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise OptionError("max_images_per_batch", f"must be a positive integer, not {max_images_per_batch!r}")
    options = (source or SourceOptions()).keywords()
    shards = expand_urls(urls, **options)
    if not shards:
        raise ValueError(f"no files match {urls!r}")
    sample = {
        "image_keys": list(image_keys) if image_keys is not None else list(DEFAULTS.image_keys),
        "caption_key": caption_key,
        "max_pixels": int(max_pixels) if max_pixels is not None else int(DEFAULTS.max_pixels),
        "max_member_bytes": int(DEFAULTS.max_member_bytes),
    }
    spec = (naflex.patch_size, naflex.max_num_patches, naflex.min_num_patches or 0)
    plan = PatchCounts(spec, max_patches_per_batch, buckets, max_images_per_batch, sample, [])
    config = {**source_config(shards, options), **_core_config(plan)}

    def count(files: list[str], threads: int) -> list[dict[str, Any]]:
        return _core.count_patches(files, config, threads)

    def build(units: list[dict[str, Any]], failed: list[dict[str, Any]]) -> PatchCounts:
        return PatchCounts(spec, max_patches_per_batch, buckets, most, sample, units, failed)

    def nothing(counts: PatchCounts) -> str | None:
        if counts.total_batches:
            return None
        return f"no image of {urls!r} can be used: {counts._top_reason('samples')}"

    kind = CountingKind("count_patches", PatchCounts, count, build, nothing)
    return count_units(
        kind,
        shards,
        threads=threads or default_loader_threads(),
        source_options=options,
        on_error=on_error,
        previous=previous,
        output=output,
        distributed=distributed,
    )


class NaFlexBudgetLoader(UnitPlanLoader):
    """Iterable of :class:`~shardstream.NaFlexBatch` of varying size: token-budget batches, exact
    across ranks and DataLoader workers.

    A batch is ``[b, L, 3 * p * p]`` patches with ``b * L <= max_patches_per_batch``: ``L`` is
    its length bucket and ``b`` the images that fit (fewer in a unit's last batch of a bucket,
    or when an image whose header parsed fails to decode: it is dropped from its batch and
    counted in ``stats["skipped"]``).

    Args:
        counts: The dataset's :class:`PatchCounts` (or the path of a saved one), from
            :func:`count_patches`: its grids, budget, buckets and sample keys are the loader's.
        seed: Seeds the order of units in an epoch and the random crops.
        random_crop: As :class:`~shardstream.NaFlex`'s, except that the crop is resized to the
            whole image's grid (its patch count was planned from the header), so the aspect
            jitter becomes a stretch, as in RandomResizedCrop.
        random_crop_scale: With ``random_crop``: the crop's area fraction (default
            ``(0.8, 1.0)``, as :class:`NaFlex`'s).
        random_crop_ratio: With ``random_crop``: the crop's aspect as a factor of the image's.
        tokenizer: Tokenize the captions in the Rust threads into ``NaFlexBatch.tokens``
            (``[b, context_length]`` int64), as :class:`~shardstream.LoaderConfig`'s
            ``tokenizer`` (an open_clip model name, a BPE file, or a ``tokenizer.json`` such as
            SigLIP 2's Gemma one). None: ``tokens`` is None.
        context_length: Tokens per caption (see :class:`~shardstream.LoaderConfig`).
        rank: This process's rank; default: ``torch.distributed`` when initialised, else the
            ``RANK`` environment variable, else 0.
        world_size: Ranks; default as ``rank``.
        threads: Threads decoding (default: this process's share of the cores).
        prefetch: Batches filled ahead of the one being used.
        pin_memory: Batches in pinned memory; default: when CUDA is available.
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        ValueError: the dataset holds fewer batches than ranks.
    """

    _counts_type = PatchCounts

    def __init__(
        self,
        counts: PatchCounts | str | os.PathLike[str],
        *,
        seed: int = 0,
        random_crop: bool = False,
        random_crop_scale: tuple[float, float] = (0.8, 1.0),
        random_crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        tokenizer: str | None = None,
        context_length: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        threads: int | None = None,
        prefetch: int = 2,
        pin_memory: bool | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        from shardstream.tokenizer import core_tokenizer, resolve_tokenizer

        c = self._load_counts(counts)
        patch_size, max_num_patches, min_num_patches = c.naflex
        # Validates the crop settings as the fixed-count kind does.
        self.naflex = NaFlex(
            patch_size=patch_size,
            max_num_patches=max_num_patches,
            min_num_patches=min_num_patches or None,
            random_crop=random_crop,
            random_crop_scale=random_crop_scale,
            random_crop_ratio=random_crop_ratio,
        )
        self._config = {
            **self._start_plan(seed, rank, world_size, threads, prefetch, pin_memory, source),
            **_core_config(c),
            "naflex": self.naflex.core_config()["naflex"],
        }
        # (kind, path, context_length): the captions are tokenized in the Rust decode threads.
        self._tokenizer = resolve_tokenizer(tokenizer, context_length) if tokenizer is not None else None
        self._config["tokenizer"] = core_tokenizer(self._tokenizer)
        # A full batch of the shortest bucket holds the most images (and token rows).
        self._max_images = max(1, min(c.max_patches_per_batch // c.buckets[0], c.max_images_per_batch))
        self._batch_bytes = c.max_patches_per_batch * self.naflex.patch_len
        self._require_a_batch_per_rank(
            f"the dataset makes {self._total} batches under max_patches_per_batch="
            f"{c.max_patches_per_batch}, fewer than the {self.world_size} ranks"
        )

    def _shape(self) -> tuple[int, int, int, int, int]:
        return (self.world_size, self._num_workers, 1, 1, 1)

    def _layout(self) -> tuple[tuple[tuple[int, ...], Any], tuple[tuple[int, ...], Any] | None]:
        tokens = ((self._max_images, self._tokenizer[2]), np.int64) if self._tokenizer is not None else None
        return ((self._batch_bytes,), np.uint8), tokens

    def _iterate(self, worker: int, workers: int) -> Iterator[NaFlexBatch]:
        from shardstream.plan import derive_seed

        config = dict(self._config, threads=self.threads, crop_seed=derive_seed([self.seed, self.epoch]))
        core = _core.budget_pipeline(
            self._units,
            self._weights,
            self._reader(worker),
            config,
        )
        yield from self._pass(core, workers, self._make_batch)

    def _make_batch(self, result: Any, buf: Any, toks: Any) -> tuple[NaFlexBatch, None]:
        images, length, grids, texts, keys, urls = result
        shape = (images, length, self.naflex.patch_len)
        pixels = buf[: images * length * self.naflex.patch_len].reshape(shape)
        tokens = toks[:images] if toks is not None else None
        return self.naflex.make_batch(pixels, grids, texts, keys, urls, tokens, length=length), None

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank: ``batches``, ``images``,
        ``patches`` (of the images' grids), ``slots`` (patch slots of the batches: ``1 -
        patches / slots`` is the padding), ``skipped`` (images dropped at decode, by reason),
        ``bytes``, ``retries``, ``decode_seconds``; and for the epoch: ``remainder_batches``
        (read by no rank) and ``exact`` (True)."""
        stats = dict(self._last_stats)
        stats["remainder_batches"] = self._unread_weight()
        stats["exact"] = True
        return stats
