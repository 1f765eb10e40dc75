"""ShardLoader: batches of decoded, resized images and captions, streamed from shards.

The Rust pipeline reads, groups, decodes and resizes on its own threads with the GIL released;
this module lends it output buffers (torch tensors, pinned when CUDA is present) that it fills
in place, so a batch reaches Python without a copy.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from shardstream import _core
from shardstream._loader_base import LoaderBase, distributed_rank_world
from shardstream._stats import add_stats_delta, is_skip_reason, merge_stats, raise_if_all_skipped, stats_delta
from shardstream.config import Crop, LoaderConfig, OnError, SourceOptions, resolve_source_options
from shardstream.errors import OptionError, ShardError
from shardstream.kinds.naflex import NaFlex, NaFlexBatch
from shardstream.urls import source_config

# Where they were defined before shardstream._stats, _workers and _loader_base: still importable.
__all__ = [
    "Batch",
    "ShardLoader",
    "add_stats_delta",
    "distributed_rank_world",
    "merge_stats",
    "raise_if_all_skipped",
    "stats_delta",
]

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]


class Batch(NamedTuple):
    """One batch of a :class:`ShardLoader`: a named tuple, so ``images, texts, *_ = batch`` works
    and ``batch._replace(images=...)`` makes a changed copy.

    ``B`` is the batch size (smaller only for the last batch of an epoch with ``drop_last=False``)
    and the i-th entry of every field belongs to the same sample.

    Attributes:
        images: ``torch.uint8`` tensor ``[B, 3, S, S]`` (``S`` = ``image_size``), RGB, channels
            first, values 0-255, not normalised: normalise on the GPU, where uint8 is a quarter
            of the float32 transfer. Pinned memory when ``pin_memory``. A numpy array without
            torch. Each batch owns its memory: keeping it is safe.
        texts: The captions, ``B`` strings (the ``caption_key`` member, UTF-8 decoded).
        keys: The samples' keys (``__key__``), ``B`` strings: what ``stats`` and errors name.
        urls: The URL of the shard each sample came from (redacted: no signature or password).
        tokens: With ``tokenizer=``: ``torch.int64`` ``[B, context_length]``, the captions
            tokenized and padded in the loader's threads (numpy without torch); else None.
    """

    images: Any
    texts: list[str]
    keys: list[str]
    urls: list[str]
    tokens: Any = None


class ShardLoader(LoaderBase):
    """Iterable of :class:`Batch`: decoded, resized images and their captions, streamed from
    WebDataset shards (or Parquet files) by the Rust core, exactly once per epoch across ranks.

    Three ways to say what to read:

    - ``urls`` alone: shards are split between readers (ranks x workers) at shard level; with
      several readers, ``samples_per_epoch`` fixes the batches per rank so every rank steps
      equally. Epochs are not exact (a warning says so) and mid-epoch resume is unavailable.
    - ``index`` (from ``shardstream index`` or :func:`~shardstream.build_index`), with or
      without ``urls``: every epoch is exact (each valid sample once across all ranks and
      workers, the same batch count on every rank, deterministic order) and
      :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch, also on another world size.
    - ``sources`` (a list of :class:`~shardstream.Source`): several indexed datasets mixed in
      one exact epoch, each batch holding every source in proportion to its weight.

    Example:
        >>> loader = ShardLoader("shards/{000000..000009}.tar", index="shards.index",
        ...                      batch_size=256)  # doctest: +SKIP
        >>> for epoch in range(2):  # doctest: +SKIP
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:
        ...         images = batch.images.cuda(non_blocking=True).float().div_(255)

    Args:
        urls: The shards: a path, a folder (its ``.tar``/``.tar.gz``/``.tgz``/``.parquet``
            files), a glob, a URL (``file://``, ``http(s)://``, ``s3://``,
            ``hf://datasets/ORG/NAME[@REV]/PATH``) with brace ranges (``{000000..000099}``) and
            ``::``-separated lists, or a list of those. With an ``index``: optional; if given,
            the same shards the index names (its URLs; a relative local path matches the
            absolute one the index records). Shards moved elsewhere need ``shardstream index``
            again. ``pipe:`` URLs are refused.
        batch_size: See :class:`~shardstream.LoaderConfig` (required).
        image_size: See :class:`~shardstream.LoaderConfig`.
        seed: See :class:`~shardstream.LoaderConfig`.
        shuffle_buffer: See :class:`~shardstream.LoaderConfig`.
        threads: See :class:`~shardstream.LoaderConfig`.
        rank: This process's rank. None (default): ``torch.distributed``'s when it is
            initialised, else the ``RANK`` environment variable, else 0.
        world_size: The number of ranks. None (default): as for ``rank`` (``WORLD_SIZE``, else 1).
        index: The dataset index: where ``shardstream index -o`` wrote it (a folder, its
            ``manifest.bin``, or a ``.json`` file; local or a URL), or a ``DatasetIndex``. Makes
            epochs exact. None (default): streaming without one.
        drop_last: See :class:`~shardstream.LoaderConfig`.
        on_error: See :class:`~shardstream.LoaderConfig`.
        caption_key: See :class:`~shardstream.LoaderConfig`.
        image_keys: See :class:`~shardstream.LoaderConfig`.
        crop: See :class:`~shardstream.LoaderConfig`.
        random_crop_scale: See :class:`~shardstream.LoaderConfig`.
        random_crop_ratio: See :class:`~shardstream.LoaderConfig`.
        samples_per_epoch: See :class:`~shardstream.LoaderConfig`.
        read_ahead: See :class:`~shardstream.LoaderConfig`.
        prefetch: See :class:`~shardstream.LoaderConfig`.
        max_pixels: See :class:`~shardstream.LoaderConfig`.
        max_member_bytes: See :class:`~shardstream.LoaderConfig`.
        pin_memory: See :class:`~shardstream.LoaderConfig`.
        connect_timeout: See :class:`~shardstream.LoaderConfig`.
        read_timeout: See :class:`~shardstream.LoaderConfig`.
        max_retries: See :class:`~shardstream.LoaderConfig`.
        tokenizer: See :class:`~shardstream.LoaderConfig`.
        context_length: See :class:`~shardstream.LoaderConfig`.
        sources: A mixture: a list of :class:`~shardstream.Source`, each with its own index
            (instead of ``urls`` and ``index``). None (default): one dataset.
        sample: The sample kind: a :class:`~shardstream.kinds.NaFlex` makes batches of patch
            sequences at each image's own aspect ratio (:class:`~shardstream.kinds.NaFlexBatch`);
            ``image_size``, ``crop`` and the ``random_crop_*`` arguments are then refused (the
            spec has its own). None (default): square images (:class:`Batch`).
        source: How shards are fetched (S3 endpoint, region and profile, presign lifetime, TLS
            roots, backoff, ``Retry-After`` limit, shard cache, existence check): a
            :class:`~shardstream.SourceOptions`. None (default): its defaults.
        **source_options: Deprecated: the fields of :class:`~shardstream.SourceOptions` as
            keyword arguments (``endpoint_url=...``); they still work for one release, with a
            :class:`DeprecationWarning`. An unknown keyword is a ``TypeError`` naming it.

    Raises:
        OptionError: A :class:`~shardstream.LoaderConfig` or :class:`~shardstream.SourceOptions`
            value is out of range (a ``ValueError``; ``option`` names it), a square-image
            argument is given with ``sample=NaFlex(...)``, or several ranks (``world_size``,
            ``torch.distributed`` or ``WORLD_SIZE``) are given no ``index``, ``sources`` or
            ``samples_per_epoch`` (``option`` is ``"samples_per_epoch"``; the message says how
            to pass either).
        ValueError: Neither ``urls``, ``index`` nor ``sources`` is given, ``sources`` is given
            with ``urls`` or ``index``, no shard matches ``urls``, or the index and ``urls``
            name different shards.
        TypeError: An unknown keyword argument, or ``source`` with the keyword form.
        NotFoundError: The first shard of a folder or prefix (or the index) does not exist.
        CredentialsError: It exists but the credentials cannot read it.
        BadUrlError: A URL is refused (``pipe:``, an unknown scheme, a malformed brace range).
        MissingDependencyError: ``s3://`` without boto3, ``hf://`` without huggingface_hub.

    Attributes:
        config: The :class:`~shardstream.LoaderConfig` made from the arguments.
        epoch: The epoch the next pass reads (see :meth:`set_epoch`).
    """

    def __init__(
        self,
        urls: str | list[str] | None = None,
        *,
        batch_size: int,
        image_size: int = LoaderConfig.image_size,
        seed: int = LoaderConfig.seed,
        shuffle_buffer: int = LoaderConfig.shuffle_buffer,
        threads: int | None = LoaderConfig.threads,
        rank: int | None = None,
        world_size: int | None = None,
        index: Any = None,
        drop_last: bool = LoaderConfig.drop_last,
        on_error: OnError = LoaderConfig.on_error,
        caption_key: str = LoaderConfig.caption_key,
        image_keys: list[str] | None = LoaderConfig.image_keys,
        crop: Crop = LoaderConfig.crop,
        random_crop_scale: tuple[float, float] = LoaderConfig.random_crop_scale,
        random_crop_ratio: tuple[float, float] = LoaderConfig.random_crop_ratio,
        samples_per_epoch: int | None = LoaderConfig.samples_per_epoch,
        read_ahead: int = LoaderConfig.read_ahead,
        prefetch: int = LoaderConfig.prefetch,
        max_pixels: int = LoaderConfig.max_pixels,
        max_member_bytes: int = LoaderConfig.max_member_bytes,
        pin_memory: bool | None = LoaderConfig.pin_memory,
        connect_timeout: float = LoaderConfig.connect_timeout,
        read_timeout: float = LoaderConfig.read_timeout,
        max_retries: int = LoaderConfig.max_retries,
        tokenizer: str | None = LoaderConfig.tokenizer,
        context_length: int | None = LoaderConfig.context_length,
        sources: list[Any] | None = None,
        sample: NaFlex | None = None,
        source: SourceOptions | None = None,
        **source_options: Any,
    ) -> None:
        source_options = resolve_source_options(source, source_options, "ShardLoader")
        if sample is not None:
            _refuse_square_arguments(sample, image_size, crop, random_crop_scale, random_crop_ratio)
        # The keyword arguments are the fields of LoaderConfig, which checks them.
        self.config = LoaderConfig(
            batch_size=batch_size,
            image_size=image_size,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            threads=threads,
            drop_last=drop_last,
            on_error=on_error,
            caption_key=caption_key,
            image_keys=tuple(image_keys) if image_keys is not None else None,
            crop=crop,
            random_crop_scale=random_crop_scale,
            random_crop_ratio=random_crop_ratio,
            samples_per_epoch=samples_per_epoch,
            read_ahead=read_ahead,
            prefetch=prefetch,
            max_pixels=max_pixels,
            max_member_bytes=max_member_bytes,
            pin_memory=pin_memory,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_retries=max_retries,
            tokenizer=tokenizer,
            context_length=context_length,
        )
        from shardstream.urls import expand_urls

        if sources is not None and (urls is not None or index is not None):
            raise ValueError("give sources, or urls and an index, not both: each Source has its own")
        if urls is None and index is None and sources is None:
            raise ValueError("give urls, an index, or both (or sources, for a mixture)")
        self._shards = expand_urls(urls, **source_options) if urls is not None else None
        if self._shards is not None and not self._shards:
            raise ValueError(f"no shards match {urls!r}")
        self._init_loader(rank, world_size, threads, prefetch, pin_memory)
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed
        self.shuffle_buffer = max(1, shuffle_buffer)
        self.drop_last = drop_last
        self.samples_per_epoch = samples_per_epoch
        # What the Rust pipeline of every reader is started with (_core.sample_pipeline's config).
        self._config: dict[str, Any] = self.config.core_config()
        self.sample = sample
        if sample is not None:
            self._config.update(sample.core_config())
        from shardstream.tokenizer import core_tokenizer, resolve_tokenizer

        # (kind, path, context_length): the captions are tokenized in the Rust decode threads.
        self._tokenizer = resolve_tokenizer(tokenizer, context_length) if tokenizer is not None else None
        self._config["tokenizer"] = core_tokenizer(self._tokenizer)
        from shardstream.urls import split_options

        self._source_options = source_options
        self._config.update(split_options(source_options).reader)
        self._plan = None
        self._source_names: list[str] | None = None
        if sources is not None:
            from shardstream.planned_mixture import MixturePlanner

            mixture = MixturePlanner(list(sources), samples_per_epoch, **source_options)
            self._plan = mixture
            self._source_names = mixture.names
            self._config["sources"] = list(zip(mixture.first_shards(), mixture.caption_keys(), strict=True))
        elif index is not None:
            from shardstream.plan import EpochPlanner

            self._plan = EpochPlanner(index, self._shards, **source_options)
            self._shards = None  # the index names them (in Rust): nothing per shard here
        self._warned_inexact = False
        # Several ranks known now (an argument, torch.distributed, or torchrun's WORLD_SIZE):
        # refused here, not at the first batch, which under DDP may be minutes of setup later.
        self._check_readers(self.world_size)

    def __len__(self) -> int:
        """Batches this rank yields in the current pass: after a resume, those left in the epoch."""
        if self._plan is not None:
            return self._plan.plan(self._plan_params(self._num_workers), self._resume).num_batches
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch // (self.world_size * self.batch_size)
        raise TypeError("len() needs an index or samples_per_epoch")

    # -- iteration ------------------------------------------------------------------------
    def _plan_params(self, workers: int) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "workers": workers,
            "batch_size": self.batch_size,
            "block_size": self.shuffle_buffer,
            "drop_last": self.drop_last,
        }

    def _streaming_reader(self, worker: int, workers: int) -> tuple[list, dict[str, Any]]:
        """Shard-level split without an index (see shardstream.plan.streaming_spans)."""
        from shardstream.plan import streaming_spans

        spans, quota, shuffle_seed = streaming_spans(
            len(self._shards),
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            worker=worker,
            world_size=self.world_size,
            workers=workers,
            batch_size=self.batch_size,
            block_size=self.shuffle_buffer,
            samples_per_epoch=self.samples_per_epoch,
        )
        if self.world_size * workers > 1 and not self._warned_inexact:
            self._warned_inexact = True
            warnings.warn(
                "shardstream: no index given, so epochs are not exact (shard-level splitting, "
                f"{quota} batches per reader from samples_per_epoch); build one with `shardstream index`",
                stacklevel=3,
            )
        extra = {"num_batches": quota, "cycle": quota is not None, "shuffle_seed": shuffle_seed}
        return [(self._shards[s].url, s, 0, 0, 0, None, stride) for s, stride in spans], extra

    def _check_readers(self, readers: int) -> None:
        """Without an index, several readers (ranks x DataLoader workers) only step equally with
        a fixed quota: refused with the two ways out, as an :class:`OptionError`."""
        if self._plan is None and self.samples_per_epoch is None and readers > 1:
            world = self.world_size
            who = f"{world} ranks" if readers == world else f"{world} rank(s) x {readers // world} workers"
            raise OptionError(
                "samples_per_epoch",
                f"several readers without an index need samples_per_epoch ({readers} readers: {who}), "
                "so that every rank yields the same number of batches. Either pass "
                "index=INDEX, built once with `shardstream index URLS -o INDEX` (exact epochs, "
                "mid-epoch resume), or samples_per_epoch=N, the samples of one epoch over all "
                "ranks (shard-level streaming, not exact, as open_clip's --train-num-samples)",
            )

    def _core_loader(self, worker: int, workers: int) -> tuple[Any, int]:
        """The Rust pipeline of reader (rank, worker), and the phase reader it plays."""
        rank, world = self.rank, self.world_size
        config = dict(self._config, threads=self.threads)
        if self._plan is not None:
            # workers=0: one reader in this process; K DataLoader workers: reader `worker` of K.
            reader = self._plan.reader(
                self._plan_params(workers if workers > 1 else self._num_workers), self._resume, rank, worker
            )
            spans = reader.pop("spans")
            phase_reader = reader.pop("reader")
            config.update(reader, planned=True)
            config.update({k: v for k, v in self._plan.source_config().items() if k not in config})
            display: list[str] = []
        else:
            if self._resume is not None:
                raise ValueError(
                    "mid-epoch resume needs an index (exact epochs); build one with `shardstream index`"
                )
            self._check_readers(world * max(workers, 1))
            spans, extra = self._streaming_reader(worker, workers)
            phase_reader = worker
            config.update(extra, block_size=self.shuffle_buffer, first_block=0)
            config.update(source_config(self._shards, self._source_options))  # an explicit ca_bundle wins
            display = [s.display for s in self._shards]
        config["crop_seed"] = _seed(self.seed, self.epoch)
        return _core.sample_pipeline(spans, config, display), phase_reader

    def _layout(self) -> tuple[tuple[tuple[int, ...], Any], tuple[tuple[int, ...], Any] | None]:
        shape: tuple[int, ...] = (self.batch_size, 3, self.image_size, self.image_size)
        if self.sample is not None:
            shape = self.sample.buffer_shape(self.batch_size)
        tokens = (self.batch_size, self._tokenizer[2]) if self._tokenizer is not None else None
        return (shape, np.uint8), ((tokens, np.int64) if tokens is not None else None)

    def _iterate(self, worker: int, workers: int) -> Iterator[Batch]:
        core, phase_reader = self._core_loader(worker, workers)
        yield from self._pass(core, workers, functools.partial(self._make_batch, phase_reader))

    def _make_batch(self, phase_reader: int, result: Any, buf: Any, toks: Any) -> tuple[Any, tuple[int, int]]:
        n, keys, texts, urls, reserve_used, grids = result
        if toks is not None and n < self.batch_size:
            toks = toks[:n]
        pixels = buf[:n] if n < self.batch_size else buf
        if self.sample is not None:
            batch = self.sample.make_batch(pixels, grids, texts, keys, urls, toks)
        else:
            batch = Batch(pixels, texts, keys, urls, toks)
        return batch, (phase_reader, reserve_used)

    def _no_batch(self, error: ShardError | None) -> None:
        # A planned pass whose first batch failed whole fails in the core, named by its top skip
        # reason: the same error as an all-skipped streaming pass.
        if error is None or is_skip_reason(error.reason, self._last_stats):
            raise_if_all_skipped(self._last_stats)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank (summed over its DataLoader
        workers), as a plain dict. Empty before the first pass. The keys:

        - ``samples``: samples yielded in batches; ``batches``: batches yielded;
          ``bytes``: bytes read from the sources.
        - ``retries``: requests retried after a reset, a timeout or a 5xx; ``throttled``: those
          of them that waited for a server's ``Retry-After`` (429/503 SlowDown); ``resumes``:
          shard reads resumed mid-way with a range request after a dropped connection.
        - ``cache_hits``, ``cache_misses``, ``cache_errors``: shards served from, fetched into,
          or failing to go into the shard cache (``SourceOptions(cache_dir=...)``; 0 without).
        - ``decode_seconds``: thread-seconds spent decoding and resizing.
        - ``skipped``: samples skipped, by reason (``corrupt_image``, ``missing_caption``, ...);
          ``skipped_total``: their sum; ``shard_errors``: shards that could not be read, by
          reason; ``faults``: the first 1,000 of those events, each a dict of ``reason``,
          ``url`` (redacted), ``key`` and ``detail``.
        - ``replaced``: samples that failed at run time and were replaced from the rank's
          reserve; ``padded``: batch slots filled by repeating a sample when the reserve ran
          out (both keep every rank's batch count equal).
        - ``remainder``: the samples of the epoch that no rank yields (``drop_last``: fewer than
          one global batch); ``remainder_keys``: their keys. With an index these are the
          epoch's, across all ranks, from the plan; without one, this reader's.
        - ``samples_by_source``: with ``sources=``, samples yielded per source name.
        - ``exact``: True with an index or ``sources`` (exact epochs), False when streaming
          without an index.
        """
        stats = dict(self._last_stats)
        by_source = stats.pop("samples_by_source", None)
        if self._source_names is not None:
            counts = by_source or {}
            stats["samples_by_source"] = {
                name: int(counts.get(str(i), 0)) for i, name in enumerate(self._source_names)
            }
        if self._plan is not None:
            params = self._plan_params(self._num_workers)
            stats["remainder"] = self._plan.plan(params, self._resume).remainder_len
            stats["remainder_keys"] = self._plan.remainder_keys(params, self._resume, self._config)
            stats["exact"] = True
        else:
            stats["exact"] = False
        return stats

    # -- resume --------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        """The position in the epoch after the batches consumed so far: small, JSON-serialisable
        and identical on every rank, so rank 0 can save it.

        This is torchdata's StatefulDataLoader contract, which accelerate and Lightning look for:
        "consumed" are the batches this loader has yielded, so a framework that reads ahead of
        its step must not sit between the two (``shardstream.integrations`` arranges that). The
        state also records the reserve samples that replaced samples failing at run time, so a
        resumed epoch never refills from them twice.

        Args:
            batches: The batches consumed, if not all those yielded (for a DataLoader of your own
                over :meth:`dataset_view`). None (default): those yielded.
            gather: With several ranks, collect every rank's reserve use (a collective: call it
                on every rank, as the trainer's and the adapters' checkpoint hooks do). False
                (default): a multi-rank state leaves reserve use out rather than differ between
                ranks.

        Returns:
            ``{"epoch", "batches", "exact": False}`` without an index; with one, the plan's
            state (``version``, ``epoch``, phases), which :meth:`load_state_dict` takes.

        Raises:
            RuntimeError: ``gather=True`` with several ranks but no initialised process group.
        """
        done = self._batches_consumed(batches)
        if self._plan is None:
            return {"epoch": self.epoch, "batches": done, "exact": False}
        uses = self.reserve_use(done)
        if gather and self.world_size > 1:
            uses = _gather_from_ranks(uses, max(self._num_workers, 1))
        elif self.world_size > 1:
            uses = []
        reserve_used = [(u["rank"], u["reader"], u["used"]) for u in uses]
        return self._plan.state(self._plan_params(self._num_workers), self._resume, done, reserve_used)

    def reserve_use(self, batches: int | None = None) -> list[dict[str, int]]:
        """This rank's use of its reserve samples (which replace samples failing at run time).

        Batches that came through a DataLoader other than :meth:`dataloader` are not seen here.

        Args:
            batches: Count the reserve used in this rank's first ``batches`` batches. None
                (default): in all those yielded.

        Returns:
            ``[{"rank", "reader", "used"}]``, one entry per phase reader that used any.
        """
        done = self._batches_done if batches is None else int(batches)
        used: dict[int, int] = {}
        for reader, count in self._reserve_marks[:done]:
            used[reader] = max(used.get(reader, 0), count)
        return [{"rank": self.rank, "reader": r, "used": n} for r, n in sorted(used.items()) if n]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass continue the epoch of ``state`` with exactly the batches that would
        have followed; with another world size or worker count, the rest of the epoch is
        re-planned so that every remaining sample is read exactly once.

        Args:
            state: What :meth:`state_dict` returned (on any rank, any world size).

        Raises:
            ValueError: The loader has no index, or ``state`` is not an exact (indexed) state.
        """
        if self._plan is None or not state.get("version"):
            raise ValueError(
                "mid-epoch resume needs an index (exact epochs); build one with `shardstream index`"
            )
        self.epoch = int(state["epoch"])
        self._load_position(state)

    def dataloader(
        self,
        num_workers: int,
        *,
        batch_transform: Callable[[Batch], Batch] | None = None,
        **kwargs: Any,
    ) -> Any:
        """This loader read by ``num_workers`` DataLoader worker processes, each running its own
        Rust pipeline on its own part of this rank's share, optionally with a Python transform.

        Iterating it yields :class:`Batch` es and keeps what :meth:`state_dict` and :attr:`stats`
        need (the batch count, the workers' counters), so resume stays exact on any worker count.

        ``batch_transform`` is the supported place for Python-side augmentation: it runs in the
        worker processes (in parallel, off the training loop) on each whole batch. For
        augmentation on the GPU instead, transform ``batch.images`` after moving it there;
        ``torchvision.transforms.v2`` accepts the uint8 ``[B, 3, S, S]`` tensor as it is, but
        draws its random parameters once per call, so a whole batch gets the same flip or crop
        (per-sample randomness: a mask, e.g. ``torch.where(flip[:, None, None, None],
        images.flip(-1), images)``).

        Example:
            >>> def flip_half(batch):  # doctest: +SKIP
            ...     flip = torch.rand(len(batch.keys)) < 0.5
            ...     images = torch.where(flip[:, None, None, None], batch.images.flip(-1), batch.images)
            ...     return batch._replace(images=images)
            >>> for batch in loader.dataloader(4, batch_transform=flip_half):  # doctest: +SKIP
            ...     ...

        Args:
            num_workers: Worker processes (0: read in this process, through the DataLoader).
                With several ranks and no index, ``samples_per_epoch`` is required.
            batch_transform: ``fn(batch) -> Batch``, applied to every batch in the worker that
                read it (so with the worker's own torch seed: set per-worker seeds through
                ``worker_init_fn`` for reproducible randomness). It must return a
                :class:`Batch` (use ``batch._replace(...)``) and, with worker processes started
                by ``spawn``, be picklable (a module-level function). None (default): batches
                as decoded.
            **kwargs: Passed to ``torch.utils.data.DataLoader`` (``pin_memory`` defaults to the
                loader's; ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``,
                ``worker_init_fn`` ...). Not ``batch_size``, ``collate_fn`` or ``sampler``: the
                loader batches itself.

        Returns:
            An iterable of :class:`Batch` with ``len()``, ``set_epoch``, ``state_dict`` and
            ``load_state_dict`` that act on this loader.

        Raises:
            TypeError: ``collate_fn`` (or ``batch_size``/``sampler``) is given; or, when
                iterated, ``batch_transform`` returned something other than a :class:`Batch`.
            OptionError: Several readers (ranks x ``num_workers``) without an index or
                ``samples_per_epoch`` (a ``ValueError``).
            MissingDependencyError: torch is not installed.
        """
        transform = functools.partial(_transformed, batch_transform) if batch_transform is not None else None
        hint = "; transform them with batch_transform=fn (fn(Batch) -> Batch, run in the workers)"
        return self._open_workers(num_workers, kwargs, transform=transform, hint=hint)


def _refuse_square_arguments(sample: NaFlex, image_size: int, crop: Crop, scale: Any, ratio: Any) -> None:
    """Raises OptionError naming the first square-image argument given a non-default value
    alongside ``sample`` (whose spec has its own size and crop)."""
    if not isinstance(sample, NaFlex):
        raise TypeError(f"sample must be a shardstream.kinds.NaFlex or None, not {type(sample).__name__}")
    given = {
        "image_size": (image_size, LoaderConfig.image_size),
        "crop": (crop, LoaderConfig.crop),
        "random_crop_scale": (tuple(scale), tuple(LoaderConfig.random_crop_scale)),
        "random_crop_ratio": (tuple(ratio), tuple(LoaderConfig.random_crop_ratio)),
    }
    for name, (value, default) in given.items():
        if value != default:
            raise OptionError(
                name,
                f"is a square-image option; with sample=NaFlex(...) the image size comes from "
                f"max_num_patches and the crop from NaFlex(random_crop=...), not {value!r}",
            )


def _seed(*parts: int) -> int:
    from shardstream.plan import derive_seed

    return derive_seed(list(parts))


def _gather_from_ranks(uses: list[dict[str, int]], readers: int) -> list[dict[str, int]]:
    """Every rank's reserve use, on every rank: one all_gather of a tensor of ``readers`` counts
    (no pickling; on the device the backend needs: CUDA for NCCL)."""
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        raise RuntimeError("state_dict(gather=True) with several ranks needs torch.distributed initialised")
    dist = torch.distributed
    on_cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    mine = torch.zeros(readers, dtype=torch.int64, device=device)
    for u in uses:
        mine[u["reader"]] = u["used"]
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [
        {"rank": rank, "reader": reader, "used": used}
        for rank, counts in enumerate(everyone)
        for reader, used in enumerate(counts.tolist())
        if used
    ]


def _transformed(transform: Callable[[Batch], Batch], batch: Batch) -> Batch:
    """``transform(batch)``, which must stay a Batch: the counting, pinning and framework
    adapters downstream rely on its fields."""
    result = transform(batch)
    if not isinstance(result, (Batch, NaFlexBatch)):
        raise TypeError(
            f"batch_transform must return a shardstream.Batch (use batch._replace(...)), "
            f"got {type(result).__name__}"
        )
    return result
