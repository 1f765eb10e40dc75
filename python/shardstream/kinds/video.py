"""Video-text CLIP clips (ViCLIP / InternVideo style): each sample's video decoded at ``T``
frames spread uniformly over it, each the centred square of the frame resized to ``S``, as
``uint8 [B, T, 3, S, S]`` batches with their captions, exact across ranks and DataLoader
workers.

Two steps, as for the other kinds planned by unit weights (a count, then a loader):

1. :func:`count_clips` reads every unit (a tar shard, a Parquet row group) once and judges each
   sample from its video's container header alone (a video member, a caption, a video stream
   whose codec this FFmpeg decodes, pixels and seconds under the caps): a small JSON file
   (:class:`ClipCounts`), O(units). No frame is decoded.
2. :class:`VideoLoader` cuts the epoch's stream of clips (units in a seeded order, each its clip
   count long, clips in file order within a unit) into equal shares per rank and DataLoader
   worker (``plan::unit_stream`` in the Rust core, a clip a position): every rank yields the
   same number of batches, every clip is in exactly one batch per epoch (except the remainder,
   fewer than a global batch, reported in ``stats``), and ``state_dict`` /
   ``load_state_dict`` continue at the exact next batch, also onto another world size or worker
   count.

Only the frames sampled are decoded, with the packets their references need (see
:func:`shardstream.video.decode_frames`); clips decode in parallel in Rust threads, without the
GIL, each straight into its slot of the batch. Decoding needs the system's FFmpeg 5 (see the
video guide): without it, both steps raise :data:`shardstream.video.FfmpegUnavailable`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from shardstream import _core
from shardstream._system import default_loader_threads
from shardstream.config import OnError, SourceOptions
from shardstream.errors import OptionError
from shardstream.kinds import counts_file
from shardstream.kinds.counting import CountingKind, count_units
from shardstream.kinds.unit_plan import UnitPlanLoader

COUNTS_FORMAT = "shardstream-clip-counts"
COUNTS_VERSION = 1

#: The video member extensions tried in order by default, as WebVid, Panda-70M and InternVid's
#: WebDataset releases hold them.
VIDEO_KEYS: tuple[str, ...] = ("mp4", "webm", "mkv", "mov")

# The core's bounds (rust/src/binding/video.rs): frames a clip samples, pixels a side.
MAX_FRAMES = 1024
MAX_SIZE = 4096


class VideoBatch(NamedTuple):
    """One batch of a :class:`VideoLoader`.

    ``B`` is the batch size (smaller only when a clip whose header was sound fails to decode:
    it is dropped and counted in ``stats["skipped"]``), ``T`` the frames per clip and ``S`` the
    frame size; the i-th entry of every field belongs to the same clip.

    Attributes:
        frames: ``torch.uint8`` ``[B, T, 3, S, S]``: each clip's sampled frames in order, RGB,
            upright (rotation metadata applied), each the centred square of the frame resized
            to ``S`` (Pillow's antialiased bicubic). Not rescaled or normalised (do it on the
            device). A numpy array without torch.
        texts: The captions, ``B`` strings.
        keys: The samples' keys (``__key__``).
        urls: The URL of the shard each clip came from (redacted).
        indices: ``torch.int64`` ``[B, T]``: the frame numbers sampled from each clip (frame
            ``n`` is the one with the ``n``-th smallest presentation time).
        tokens: With ``tokenizer=``: ``torch.int64`` ``[B, context_length]``; else None.
    """

    frames: Any
    texts: list[str]
    keys: list[str]
    urls: list[str]
    indices: Any
    tokens: Any = None


@dataclass
class ClipCounts(counts_file.CountsFile):
    """How many clips every unit of a video-text dataset holds: what :class:`VideoLoader` plans
    an epoch with. Made by :func:`count_clips`; saved and loaded as JSON (gzip when the path
    ends in ``.gz``).

    Attributes:
        sample: What makes a sample a clip: ``video_keys``, ``caption_key``, ``max_pixels``,
            ``max_seconds``, ``max_member_bytes``, ``clip_times``.
        units: One dict per unit in dataset order: ``url``, ``display``, ``first_row``, ``rows``
            (None for a tar), ``identity``, ``version`` (as :class:`~shardstream.TokenCounts`'s),
            ``samples``, ``clips``, ``seconds`` (of the clips, from their headers), ``skipped``
            (reason to count) and ``examples``.
        failed: Units that could not be read, with their ``error``: no epoch reads them.
    """

    sample: dict[str, Any]
    units: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)

    FORMAT: ClassVar[str] = COUNTS_FORMAT
    VERSION: ClassVar[int] = COUNTS_VERSION
    WHAT: ClassVar[str] = "clip counts"
    WEIGHT: ClassVar[str] = "clips"

    @property
    def clips(self) -> int:
        """Clips in the dataset (samples that are not clips not counted)."""
        return self._sum("clips")

    @property
    def samples(self) -> int:
        """Samples read."""
        return self._sum("samples")

    @property
    def seconds(self) -> float:
        """Seconds of the clips, from their headers."""
        return float(sum(u["seconds"] for u in self.units))

    def _identity_head(self) -> bytes:
        return json.dumps(self.sample, sort_keys=True).encode()


def _positive(name: str, value: Any, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise OptionError(name, f"must be an integer in 1..{upper}, not {value!r}")
    return value


def count_clips(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    video_keys: Sequence[str] = VIDEO_KEYS,
    caption_key: str = "txt",
    clip_times: tuple[str, str, str] | None = None,
    max_pixels: int | None = None,
    max_seconds: float | None = None,
    threads: int | None = None,
    output: str | os.PathLike[str] | None = None,
    source: SourceOptions | None = None,
    on_error: OnError = "skip",
    previous: ClipCounts | str | os.PathLike[str] | None = None,
    distributed: bool = False,
) -> ClipCounts:
    """Counts the clips of every unit of a video-text dataset, once, for :class:`VideoLoader`.

    Every sample is judged exactly as the loader judges it, from its video's container header
    alone: a member of ``video_keys``, a caption, a container that opens with a video stream
    whose codec this FFmpeg decodes, a frame under ``max_pixels`` and a duration under
    ``max_seconds``. A sample that is not a clip is counted by reason (``missing_video``,
    ``missing_caption``, ``corrupt_video``, ``no_video_stream``, ``unsupported_codec``,
    ``too_many_pixels``, ``video_too_long``, ``member_too_large``, ...). The frames sampled and
    their size are the loader's: the same counts serve any ``frames`` and ``size``.

    Args:
        urls: Tar shards or Parquet files (as :class:`~shardstream.ShardLoader` takes them).
        video_keys: Video member extensions (or Parquet columns), tried in order.
        caption_key: The caption member or column (``json:FIELD`` for a JSON field; ``""``: no
            caption).
        clip_times: ``(member, start_field, end_field)``: a JSON member whose two fields give
            the seconds the sample's clip starts and ends at in its video (InternVid-style
            ``("json", "start", "end")``); the clip's frames are then spread over that range
            (converted to frame numbers at the video's average rate, as qwen-vl-utils'
            ``video_start``/``video_end``). A sample without the member or a field reads from
            its video's start or to its end; fields that are not seconds, or a start not before
            the end, refuse it (``bad_json``). None (default): whole videos.
        max_pixels: A video whose frames have more pixels is not a clip (``too_many_pixels``);
            default: the image kinds' cap.
        max_seconds: A video longer than this is not a clip (``video_too_long``); default: no
            cap.
        threads: Threads reading (default: this process's share of the cores).
        output: If given, the counts are also saved there.
        source: How the files are fetched (S3 endpoint, cache, ...).
        on_error: A unit that cannot be read at all: ``"skip"`` (default) leaves it out of the
            counts (in :attr:`ClipCounts.failed`) and warns; ``"raise"`` raises a
            :class:`~shardstream.ShardError` naming the first one. As
            :func:`~shardstream.count_tokens`.
        previous: Counts of an earlier pass under the same settings (or their path): only new
            and changed files are read. As :func:`~shardstream.count_tokens`'s.
        distributed: Split the files across the ranks of a torchrun job, every rank returning
            the same counts. As :func:`~shardstream.count_tokens`'s.

    Returns:
        The counts.

    Raises:
        OptionError: empty ``video_keys``, or a negative ``max_seconds``.
        ValueError: no file matches, or no sample of any unit is a clip (the message names the
            most common reason).
        ShardError: with ``on_error="raise"``, a unit could not be read.
        FfmpegUnavailable: no usable FFmpeg (an ``ImportError``).
    """
    from shardstream.config import DEFAULTS
    from shardstream.urls import expand_urls, source_config

    keys = [video_keys] if isinstance(video_keys, str) else list(video_keys)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise OptionError("video_keys", f"must name at least one extension, not {video_keys!r}")
    if clip_times is not None:
        times = tuple(clip_times)
        if len(times) != 3 or not all(isinstance(t, str) and t for t in times):
            raise OptionError(
                "clip_times", f"must be (member, start_field, end_field), three names, not {clip_times!r}"
            )
    seconds = 0.0 if max_seconds is None else float(max_seconds)
    if not seconds >= 0:
        raise OptionError("max_seconds", f"must be a number of seconds >= 0 or None, not {max_seconds!r}")
    counts_file.check_on_error(on_error)
    options = (source or SourceOptions()).keywords()
    shards = expand_urls(urls, **options)
    if not shards:
        raise ValueError(f"no files match {urls!r}")
    sample = {
        "video_keys": keys,
        "caption_key": caption_key,
        "max_pixels": int(max_pixels) if max_pixels is not None else int(DEFAULTS.max_pixels),
        "max_seconds": seconds,
        "max_member_bytes": int(DEFAULTS.max_member_bytes),
        "clip_times": list(clip_times) if clip_times is not None else None,
    }
    config = {**source_config(shards, options), **sample}

    def count(files: list[str], threads: int) -> list[dict[str, Any]]:
        return _core.count_clips(files, config, threads)

    def build(units: list[dict[str, Any]], failed: list[dict[str, Any]]) -> ClipCounts:
        return ClipCounts(sample, units, failed)

    def nothing(counts: ClipCounts) -> str | None:
        if counts.clips:
            return None
        return f"no sample of {urls!r} is a clip: {counts._top_reason('samples')}"

    kind = CountingKind("count_clips", ClipCounts, count, build, nothing)
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


class VideoLoader(UnitPlanLoader):
    """Iterable of :class:`VideoBatch`: video-text CLIP clips, exact across ranks and DataLoader
    workers.

    Each clip's ``frames`` frames are spread uniformly from its first frame to its last
    (``linspace(0, n - 1, frames).round()``, :func:`shardstream.video.clip_frames`; a clip of
    fewer frames repeats some), decoded, turned upright and fitted to ``size`` square (the
    centred square of the frame's shorter side, as ``Resize(size)`` then ``CenterCrop(size)``).
    Units are shuffled every epoch; within a unit, clips come in file order (shards written in
    a random order mix well, as for :class:`~shardstream.NaFlexBudgetLoader`).

    Args:
        counts: The dataset's :class:`ClipCounts` (or the path of a saved one), from
            :func:`count_clips`: its sample keys and caps are the loader's.
        batch_size: Clips per batch.
        frames: ``T``, frames sampled per clip (ViCLIP: 8).
        size: ``S``, pixels a side of every frame.
        seed: Seeds the order of units in an epoch.
        tokenizer: Tokenize the captions in the Rust threads into ``VideoBatch.tokens``, as
            :class:`~shardstream.LoaderConfig`'s ``tokenizer``. None: ``tokens`` is None.
        context_length: Tokens per caption (see :class:`~shardstream.LoaderConfig`).
        rank: This process's rank; default: ``torch.distributed`` when initialised, else the
            ``RANK`` environment variable, else 0.
        world_size: Ranks; default as ``rank``.
        threads: Threads decoding, one clip each (default: this process's share of the cores).
        prefetch: Batches filled ahead of the one being used.
        pin_memory: Batches in pinned memory; default: when CUDA is available.
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        OptionError: ``batch_size``, ``frames`` or ``size`` out of range.
        ValueError: the dataset holds fewer clips than one batch per rank.
        FfmpegUnavailable: no usable FFmpeg (an ``ImportError``), at the first batch.
    """

    _counts_type = ClipCounts

    def __init__(
        self,
        counts: ClipCounts | str | os.PathLike[str],
        *,
        batch_size: int,
        frames: int = 8,
        size: int = 224,
        seed: int = 0,
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

        self.batch_size = _positive("batch_size", batch_size, 1 << 20)
        self.frames = _positive("frames", frames, MAX_FRAMES)
        self.size = _positive("size", size, MAX_SIZE)
        c = self._load_counts(counts)
        self._config = {
            **self._start_plan(seed, rank, world_size, threads, prefetch, pin_memory, source),
            **c.sample,
            "frames": self.frames,
            "size": self.size,
            "batch_size": self.batch_size,
        }
        self._tokenizer = resolve_tokenizer(tokenizer, context_length) if tokenizer is not None else None
        self._config["tokenizer"] = core_tokenizer(self._tokenizer)
        self._require_a_batch_per_rank(
            f"the dataset holds {self._total} clips, fewer than a batch of {self.batch_size} for each "
            f"of the {self.world_size} ranks"
        )

    def _shape(self) -> tuple[int, int, int, int, int]:
        return (self.world_size, self._num_workers, self.batch_size, 1, 1)

    def _layout(self) -> tuple[tuple[tuple[int, ...], Any], tuple[tuple[int, ...], Any] | None]:
        frames = ((self.batch_size, self.frames, 3, self.size, self.size), np.uint8)
        tokens = ((self.batch_size, self._tokenizer[2]), np.int64) if self._tokenizer is not None else None
        return frames, tokens

    def _iterate(self, worker: int, workers: int) -> Iterator[VideoBatch]:
        config = dict(self._config, threads=self.threads)
        core = _core.video_pipeline(self._units, self._weights, self._reader(worker), config)
        yield from self._pass(core, workers, self._make_batch)

    def _make_batch(self, result: Any, buf: Any, toks: Any) -> tuple[VideoBatch, None]:
        clips, texts, keys, urls, indices = result
        index = np.asarray(indices, dtype=np.int64).reshape(clips, self.frames)
        if not isinstance(buf, np.ndarray):  # torch: the same types as the frames
            import torch

            index = torch.from_numpy(index)
        tokens = toks[:clips] if toks is not None else None
        return VideoBatch(buf[:clips], texts, keys, urls, index, tokens), None

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank: ``batches``, ``clips``,
        ``frames`` (sampled into batches), ``frames_decoded`` (what the decoder output for
        them: ``frames_decoded / frames`` is the work per frame sampled), ``skipped`` (clips
        dropped at decode, by reason), ``bytes``, ``retries``, ``decode_seconds``; and for the
        epoch: ``remainder_clips`` (read by no rank) and ``exact`` (True)."""
        stats = dict(self._last_stats)
        stats["remainder_clips"] = self._unread_weight()
        stats["exact"] = True
        return stats
