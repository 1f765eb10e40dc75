"""Interleaved image-text documents for VLMs (OBELICS, OmniCorpus, MINT-1T): each document an
ordered sequence of text segments and images, packed into rows of ``seq_len`` tokens with its
images' patches, exact across ranks, DataLoader workers and resume.

Two steps, as for text corpora (a count, then a loader):

1. :func:`count_interleaved` reads every document once (tokenizing its text, reading only its
   images' headers) and records how many batches every unit (a whole Parquet file, read one
   row group at a time; a tar shard) packs into: a small JSON file (:class:`InterleavedCounts`),
   O(units).
2. :class:`InterleavedLoader` cuts the epoch's stream of batches (units in a seeded order) into
   equal shares per rank and worker (``plan::unit_stream`` in the Rust core, a batch a position):
   every rank yields the same number of batches, every usable document is in exactly one batch
   per epoch (except the remainder, fewer batches than the world size, reported in ``stats``),
   and ``state_dict`` / ``load_state_dict`` continue at the exact next batch, also onto another
   world size or worker count.

How a document becomes tokens (the :class:`QwenVL` spec, as ``Qwen2VLProcessor``): its text
segments tokenized by a ``tokenizer.json`` (``encode(text, add_special_tokens=False)``) and
concatenated with nothing between them; each image as ``<|vision_start|>``, one
``<|image_pad|>`` per 2x2 block of its patch grid, ``<|vision_end|>``; the EOS after the last
part. How documents are packed: a document that fits a row goes whole into the first row of the
open batch with room (first fit); a longer one fills rows in turn, its text cut at a row's end,
an image never; a batch holds at most ``max_patches_per_batch`` patches. Packing is per unit,
in file order, so the count pass and the loader find the same batches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from shardstream import _core
from shardstream._system import default_loader_threads
from shardstream.config import OnError, SourceOptions
from shardstream.errors import OptionError
from shardstream.kinds import counts_file
from shardstream.kinds.captions import Captions
from shardstream.kinds.conversations import Conversations
from shardstream.kinds.counting import CountingKind, count_units
from shardstream.kinds.unit_plan import UnitPlanLoader

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

COUNTS_FORMAT = "shardstream-interleaved-counts"
COUNTS_VERSION = 1

#: Labels of tokens no loss is taken on (image runs, padding, each sequence's first token).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class QwenVideo:
    """Qwen2-VL's video rule, for documents and conversations that hold videos (a
    :class:`Conversations` sample's ``video``): which frames of a video are read, the size each
    is resized to, and the token its run is made of. The defaults are ``qwen-vl-utils``'
    ``fetch_video`` (Qwen's own pipeline): ``fps`` frames a second within ``min_frames`` and
    ``max_frames``, spread from the first frame to the last; each frame resized whole by
    ``smart_resize`` under ``min_pixels``, ``max_pixels`` and the video's share of
    ``total_pixels`` (None: the reference's defaults, see :func:`shardstream.video.frame_size`),
    with the antialiased bicubic of the image kinds. ``rule="transformers"`` picks the frames as
    ``Qwen2VLVideoProcessor.sample_frames`` does. Frames are picked by frame number, at the
    video's average frame rate (see :mod:`shardstream.video`).

    In the text a video is ``<|vision_start|>``, one ``video_token`` per merge block of each
    temporal patch (two frames), ``<|vision_end|>``; its rows are in
    :attr:`InterleavedBatch.pixel_values_videos`, its grid in ``video_grid_thw``, and its
    M-RoPE positions are Qwen2-VL's (``get_rope_index``: the temporal patch, then the block's
    row and column), or with ``tokens_per_second`` Qwen2.5-VL's, whose temporal position of
    patch ``k`` is ``k * tokens_per_second * second_per_grid_t`` truncated (``second_per_grid_t``
    the seconds a temporal patch spans at the sampled rate), as its ``get_rope_index`` computes
    it. A video is measured
    from its container alone (a demux pass; nothing decoded) when counting; one longer than
    ``max_seconds`` (0: no cap) or with a coded frame over the loader's ``max_pixels`` is
    skipped with its document before anything is decoded (``video_too_long``,
    ``too_many_pixels``), as is one whose run is longer than ``seq_len`` or whose patches are
    more than ``max_patches_per_batch`` (``video_over_row``). Needs the system's FFmpeg (see the
    video guide).

    Attributes:
        rule: ``"qwen-vl-utils"`` or ``"transformers"``.
        fps: Frames sampled a second of video.
        min_frames: Fewest frames sampled.
        max_frames: Most frames sampled.
        min_pixels: Fewest pixels of a resized frame (None: 128 merge blocks).
        max_pixels: Most pixels of a resized frame (None: 768 merge blocks, or the share of
            ``total_pixels``).
        total_pixels: Pixels of all of a video's frames (None: 90% of 128,000 merge blocks).
        max_seconds: A longer video is skipped (0: no cap).
        video_token: The token of a video's run; the tokenizer must hold it.
        tokens_per_second: Qwen2.5-VL's ``vision_config.tokens_per_second`` (2 in its
            checkpoints): temporal positions scaled by time; None: Qwen2-VL's positions.
    """

    rule: str = "qwen-vl-utils"
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: float | None = None
    max_pixels: float | None = None
    total_pixels: float | None = None
    max_seconds: float = 3600.0
    video_token: str = "<|video_pad|>"
    tokens_per_second: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in ("qwen-vl-utils", "transformers"):
            raise OptionError("video.rule", f"must be 'qwen-vl-utils' or 'transformers', not {self.rule!r}")
        if not (self.fps > 0 and 0 < self.min_frames <= self.max_frames):
            raise OptionError(
                "video.fps",
                f"fps must be positive and 0 < min_frames <= max_frames, not {self.fps}, "
                f"{self.min_frames} and {self.max_frames}",
            )
        if self.tokens_per_second is not None and not self.tokens_per_second > 0:
            raise OptionError(
                "video.tokens_per_second", f"must be positive or None, not {self.tokens_per_second}"
            )
        if self.max_seconds < 0:
            raise OptionError("video.max_seconds", f"must be 0 (no cap) or more, not {self.max_seconds}")


@dataclass(frozen=True)
class QwenVL:
    """The Qwen2-VL family's image rule (Qwen2-VL, Qwen2.5-VL images), as
    ``Qwen2VLImageProcessor``: ``smart_resize`` to sides that are multiples of ``patch_size *
    merge_size`` with between ``min_pixels`` and ``max_pixels`` pixels, the aspect kept (an
    aspect over 200 is skipped as ``too_few_patches``); Pillow's BICUBIC resize; rows of
    ``pixel_values`` in 2x2 merge blocks, each ``[3, temporal_patch_size, patch_size,
    patch_size]`` with the image repeated over the frames, uint8 (rescale and normalise on the
    device: ``pixel_values.float() / 255``, then the processor's mean and std).

    Attributes:
        min_pixels: Fewest pixels after resizing (the processor's default 56 x 56).
        max_pixels: Most pixels after resizing (default 28 x 28 x 1280).
        patch_size: Pixels a side of a patch.
        merge_size: Patches a side of a block that becomes one image token.
        temporal_patch_size: Frames a patch spans (an image is repeated over them).
        vision_tokens: The (start, end, pad) tokens; the tokenizer must hold them.
        video: How documents' videos are read (None: a document holding a video is skipped
            as ``misaligned_document``).
    """

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    vision_tokens: tuple[str, str, str] = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
    video: QwenVideo | None = None

    @property
    def row_len(self) -> int:
        """Bytes of one row of ``pixel_values``: ``3 * temporal_patch_size * patch_size**2``."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    @property
    def max_patches(self) -> int:
        """Patches of the largest image: ``max_pixels / patch_size**2``."""
        return self.max_pixels // self.patch_size**2

    def core_config(self) -> dict[str, Any]:
        """The settings as the Rust core takes them: ``vision``, :func:`_vision_dict`'s."""
        return {"vision": _vision_dict(self)}

    def settings(self) -> dict[str, Any]:
        """Its fields as the counts record them (``video`` only when set, so that counts made
        before videos read the same)."""
        s = {**asdict(self), "vision_tokens": list(self.vision_tokens)}
        if self.video is None:
            del s["video"]
        return s


@dataclass(frozen=True)
class NaFlexVL:
    """SigLIP 2's NaFlex image rule, for VLMs whose vision tower is a NaFlex SigLIP 2, as
    ``Siglip2ImageProcessor``: the largest grid of ``patch_size`` patches that holds at most
    ``max_num_patches`` of them, the aspect kept (``get_image_size_for_max_num_patches``); the
    antialiased BILINEAR resize; one ``pixel_values`` row per patch in raster order, each
    ``(y, x, channel)``, uint8 (on the device: ``/ 255``, then mean and std 0.5, which
    :class:`QwenVLCollator` does with ``image_mean=(0.5,) * 3, image_std=(0.5,) * 3``). In the
    text an image is its start token, one pad token per patch, its end token;
    ``image_grid_thw`` holds ``(1, rows, columns)``, the processor's ``spatial_shapes``.

    Attributes:
        patch_size: Pixels a side of a patch.
        max_num_patches: Most patches of one image.
        vision_tokens: The (start, end, pad) tokens; the tokenizer must hold them.
    """

    patch_size: int = 16
    max_num_patches: int = 256
    vision_tokens: tuple[str, str, str] = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")

    @property
    def row_len(self) -> int:
        """Bytes of one row of ``pixel_values``: ``3 * patch_size**2``."""
        return 3 * self.patch_size**2

    @property
    def max_patches(self) -> int:
        """Patches of the largest image: ``max_num_patches``."""
        return self.max_num_patches

    def core_config(self) -> dict[str, Any]:
        """The settings as the Rust core takes them: ``vision``, :func:`_vision_dict`'s."""
        return {"vision": _vision_dict(self)}

    def settings(self) -> dict[str, Any]:
        """Its fields as the counts record them (``family`` tells it from :class:`QwenVL`)."""
        return {**asdict(self), "vision_tokens": list(self.vision_tokens), "family": "naflex"}


def _vision_dict(spec: QwenVL | NaFlexVL) -> dict[str, Any]:
    """The one form the core takes a vision spec in: its ``settings()`` with ``family`` always
    stated ("qwen" or "naflex"; counts record a :class:`QwenVL` without it)."""
    return {"family": "qwen", **spec.settings()}


def _spec_of(settings: dict[str, Any]) -> QwenVL | NaFlexVL:
    """The vision spec recorded in counts' ``settings["spec"]`` (no ``family``: Qwen2-VL)."""
    s = dict(settings["spec"])
    family = s.pop("family", None)
    s["vision_tokens"] = tuple(s["vision_tokens"])
    if s.get("video") is not None:
        s["video"] = QwenVideo(**s["video"])
    return NaFlexVL(**s) if family == "naflex" else QwenVL(**s)


@dataclass(frozen=True)
class InterleavedCounts(counts_file.DocumentCounts, counts_file.BatchCounts):
    """How many batches every unit of an interleaved corpus packs into: what
    :class:`InterleavedLoader` plans an epoch with. Made by :func:`count_interleaved`; saved and
    loaded as JSON (gzip when the path ends in ``.gz``).

    Attributes:
        tokenizer: Path of the ``tokenizer.json`` the documents were tokenized with.
        fingerprint: Identifies that file's bytes with the EOS; a loader refuses other counts.
        settings: What decides the batches: ``spec`` (the :class:`QwenVL` fields), ``seq_len``,
            ``batch_size``, ``max_patches_per_batch``, ``texts``, ``images``,
            ``max_images_per_document``, ``max_document_bytes``, ``max_pixels``, ``eos_token``.
        units: One dict per unit (a Parquet file, a tar shard) in corpus order: ``url``,
            ``display``, ``first_row`` (0), ``rows`` (None: the whole file), ``identity``,
            ``version`` (as :class:`~shardstream.TokenCounts`'), ``documents``, ``batches``,
            ``text_tokens``, ``image_tokens``, ``images``, ``video_tokens``, ``videos`` (counts
            made before videos lack both), ``patches``, ``slots`` (token slots of
            its batches), ``padded_slots`` (the slots of ``batch_size`` documents at a time
            padded to their longest, unpacked), ``skipped`` (reason to count), ``examples``.
        failed: Units that could not be read at all, with their ``error``: no epoch reads them.
    """

    tokenizer: str
    fingerprint: str
    settings: dict[str, Any]
    units: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)

    FORMAT: ClassVar[str] = COUNTS_FORMAT
    VERSION: ClassVar[int] = COUNTS_VERSION
    WHAT: ClassVar[str] = "interleaved counts"

    @property
    def spec(self) -> QwenVL | NaFlexVL:
        """The vision spec the documents were measured with."""
        return _spec_of(self.settings)

    @property
    def tokens(self) -> int:
        """Tokens of the packed documents: text (with each EOS), image and video runs."""
        videos = sum(int(u.get("video_tokens", 0)) for u in self.units)
        return self._sum("text_tokens") + self._sum("image_tokens") + videos

    @property
    def padding(self) -> float:
        """The fraction of the batches' token slots that are padding."""
        return self._padding(self.tokens, "slots")

    @property
    def padding_to_longest(self) -> float:
        """The same fraction without packing: ``batch_size`` documents at a time in file order,
        each batch padded to its longest document (what a padding collator gives)."""
        return self._padding(self.tokens, "padded_slots")

    def _identity_head(self) -> bytes:
        return json.dumps([self.fingerprint, self.settings], sort_keys=True).encode()


def _core_config(tokenizer: str, settings: dict[str, Any]) -> dict[str, Any]:
    vision = _spec_of(settings)
    keys = ("seq_len", "batch_size", "max_patches_per_batch", "texts", "images")
    more = ("max_images_per_document", "max_document_bytes", "max_pixels", "eos_token")
    return {
        "tokenizer": tokenizer,
        **vision.core_config(),
        **{k: settings[k] for k in (*keys, *more)},
        # Counts made before layouts existed have no such setting (their layout is the lists).
        "layout": settings.get("layout"),
    }


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(name, f"must be a positive integer, not {value!r}")
    return value


def count_interleaved(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: str | os.PathLike[str],
    spec: QwenVL | NaFlexVL | None = None,
    seq_len: int = 4096,
    batch_size: int = 8,
    max_patches_per_batch: int | None = None,
    texts: str = "texts",
    images: str = "images",
    max_images_per_document: int = 64,
    max_document_bytes: int = 256 << 20,
    max_pixels: int | None = None,
    eos_token: str | None = None,
    layout: Conversations | Captions | None = None,
    threads: int | None = None,
    output: str | os.PathLike[str] | None = None,
    source: SourceOptions | None = None,
    on_error: OnError = "skip",
    previous: InterleavedCounts | str | os.PathLike[str] | None = None,
    distributed: bool = False,
) -> InterleavedCounts:
    """Counts the batches every unit of an interleaved corpus packs into, once, for
    :class:`InterleavedLoader`.

    Every document is read, tokenized and measured exactly as the loader will (in Rust threads,
    without the GIL); only image headers are decoded.

    Args:
        urls: Parquet files (OBELICS layout: aligned list columns ``texts`` of strings and
            ``images`` of binary or ``datasets`` Image structs, one of the two non-null at each
            position; a unit is the whole file, read one row group at a time, a piece of rows
            at a time) and WebDataset
            tars (MINT-1T layout: ``KEY.json`` with ``texts`` and ``images`` lists, an image
            entry naming a member of the sample by extension, ``"0.jpg"`` for ``KEY.0.jpg``; a
            unit is a shard), as
            :class:`~shardstream.ShardLoader` takes them (disk, HTTP, ``s3://``, ``hf://``).
        tokenizer: Path of a Hugging Face ``tokenizer.json`` holding the spec's vision tokens.
        spec: The model family's image rule: :class:`QwenVL` (the default, ``QwenVL()``) or
            :class:`NaFlexVL`.
        seq_len: Tokens per row.
        batch_size: Rows per batch.
        max_patches_per_batch: Patches a batch may hold (bounds the vision tower's memory);
            default ``4 * batch_size * seq_len``, what the rows can hold at most, or one largest
            image (``spec.max_patches``) when that is more; at least one largest image.
        texts: The text list column (Parquet) or JSON field (tar).
        images: The image list column or JSON field.
        max_images_per_document: A document with more images is skipped (``too_many_images``).
        max_document_bytes: A larger document (or tar member) is skipped (``member_too_large``).
            Its bytes are the text and the encoded images together, up to
            ``max_images_per_document`` of them, hence a default of 256 MiB, as a tar member's
            (``max_member_bytes``), where a text document's (:func:`count_tokens`) is 64 MiB of
            text alone.
        max_pixels: An image of more pixels by its header is a pixel bomb: its document is
            skipped (``too_many_pixels``) before anything is decoded; default: the loader's.
        eos_token: The token after every document; None: the tokenizer's usual EOS.
        layout: What a sample (a tar sample or a Parquet row) is, when not an interleaved
            document: a multi-image LLaVA conversation (:class:`~shardstream.Conversations`,
            which says how it is rendered and labelled, and which Parquet columns it reads) or
            an image-caption pair (:class:`~shardstream.Captions`); ``texts`` and ``images`` are
            then unused. None: interleaved documents (the lists).
        threads: Threads reading and tokenizing (default: this process's share of the cores).
        output: If given, the counts are also saved there.
        source: How the files are fetched (S3 endpoint, cache, ...).
        on_error: A unit that cannot be read at all: ``"skip"`` (default) leaves it out and
            warns; ``"raise"`` raises a :class:`~shardstream.ShardError` naming it. As
            :func:`~shardstream.count_tokens`.
        previous: Counts of an earlier pass under the same settings: only new and changed files
            are read. As :func:`~shardstream.count_tokens`'s.
        distributed: Split the files across the ranks of a torchrun job. As
            :func:`~shardstream.count_tokens`'s.

    Returns:
        The counts.

    Raises:
        OptionError: a setting out of range.
        ValueError: the tokenizer does not load or lacks a vision token, no file matches, or no
            document of any unit can be used (the message names the most common reason).
        ShardError: with ``on_error="raise"``, a unit could not be read.
    """
    from shardstream.config import DEFAULTS
    from shardstream.urls import expand_urls, source_config

    spec = spec if spec is not None else QwenVL()
    if not isinstance(spec, (QwenVL, NaFlexVL)):
        raise OptionError("spec", f"must be a shardstream.QwenVL or NaFlexVL, not {type(spec).__name__}")
    _positive("seq_len", seq_len)
    _positive("batch_size", batch_size)
    _positive("max_images_per_document", max_images_per_document)
    _positive("max_document_bytes", max_document_bytes)
    default_cap = max(4 * batch_size * seq_len, spec.max_patches)
    cap = default_cap if max_patches_per_batch is None else max_patches_per_batch
    if _positive("max_patches_per_batch", cap) < spec.max_patches:
        raise OptionError(
            "max_patches_per_batch",
            f"must hold one largest image of the spec ({spec.max_patches} patches), not {cap}",
        )
    if layout is not None and not isinstance(layout, (Conversations, Captions)):
        raise OptionError(
            "layout", f"must be shardstream.Conversations, Captions or None, not {type(layout).__name__}"
        )
    counts_file.check_on_error(on_error)
    options = (source or SourceOptions()).keywords()
    shards = expand_urls(urls, **options)
    if not shards:
        raise ValueError(f"no files match {urls!r}")
    tokenizer = os.path.abspath(os.fspath(tokenizer))
    settings = {
        "spec": spec.settings(),
        "seq_len": seq_len,
        "batch_size": batch_size,
        "max_patches_per_batch": cap,
        "texts": texts,
        "images": images,
        "max_images_per_document": max_images_per_document,
        "max_document_bytes": max_document_bytes,
        "max_pixels": int(max_pixels) if max_pixels is not None else int(DEFAULTS.max_pixels),
        "eos_token": eos_token,
        "layout": layout.settings() if layout is not None else None,
    }
    config = {**source_config(shards, options), **_core_config(tokenizer, settings)}
    try:
        fingerprint, _, _, _ = _core.interleaved_tokens(config)
    except ValueError as e:
        raise ValueError(str(e)) from None

    def count(files: list[str], threads: int) -> list[dict[str, Any]]:
        return _core.count_interleaved(files, config, threads)

    def build(units: list[dict[str, Any]], failed: list[dict[str, Any]]) -> InterleavedCounts:
        return InterleavedCounts(tokenizer, fingerprint, settings, units, failed)

    def nothing(counts: InterleavedCounts) -> str | None:
        if counts.total_batches:
            return None
        return f"no document of {urls!r} can be used: {counts._top_reason('documents')}"

    # The tokenizer's path may move: its fingerprint pins its bytes.
    kind = CountingKind(
        "count_interleaved", InterleavedCounts, count, build, nothing, unchecked=("tokenizer",)
    )
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


@dataclass
class InterleavedBatch:
    """One batch of packed interleaved documents, as a Qwen2-VL model takes it.

    Attributes:
        input_ids: ``[batch_size, seq_len]`` int64 ids: documents' text and image runs, each
            document followed by its EOS, rows padded at the end with ``pad_token_id``.
        labels: ``[batch_size, seq_len]`` int64: ``input_ids`` (not shifted: the model shifts),
            with ``-100`` on image runs (start, pads, end), padding, and the first token of each
            sequence (it would be predicted across a document boundary).
        position_ids: ``[batch_size, seq_len]`` int64 positions restarting at 0 at every
            document's run in a row, and over each row's padding: where they do not step by 1,
            a new sequence begins (what transformers reads to keep packed documents apart).
        pixel_values: ``[patches, 3 * temporal_patch_size * patch_size**2]`` uint8, the images'
            rows in the order their runs appear in ``input_ids`` (row-major).
        image_grid_thw: ``[images, 3]`` int64 (frames, rows, columns of patches) per image.
        cu_seqlens: int32 cumulative lengths of the sequences over the flattened rows (each
            document's run in a row, and each row's padding), for FlashAttention's varlen
            kernels.
        max_seqlen: The longest of those sequences.
        documents: Documents whose first token is in this batch.
        keys: The document of each run, in order.
        tokens: Tokens of documents (the rest of ``batch_size * seq_len`` is padding).
        image_token_id: The id of ``<|image_pad|>`` (what ``mm_token_type_ids`` marks).
        mrope_position_ids: ``[3, batch_size, seq_len]`` int64 M-RoPE (temporal, height, width)
            positions of each document's run as ``Qwen2VLModel.get_rope_index`` gives them to
            that run alone (a run continued from the previous row starts afresh); text tokens
            have the same value on all three. Under :class:`NaFlexVL` each of the three rows
            equals ``position_ids`` (1-D positions, images included). None: as ``position_ids``
            on all three rows.
        pixel_values_videos: ``[patches, 3 * temporal_patch_size * patch_size**2]`` uint8, the
            videos' rows in the order their runs appear (each row two consecutive sampled
            frames of one patch, as ``Qwen2VLVideoProcessor`` lays them out); None: the batch
            holds no video.
        video_grid_thw: ``[videos, 3]`` int64 (temporal patches, rows, columns) per video;
            None: no video.
        video_token_id: The id of ``<|video_pad|>`` (None: the spec reads no video).
    """

    input_ids: Any
    labels: Any
    position_ids: Any
    pixel_values: Any
    image_grid_thw: Any
    cu_seqlens: Any
    max_seqlen: int
    documents: int
    keys: list[str]
    tokens: int
    image_token_id: int
    mrope_position_ids: Any = None
    pixel_values_videos: Any = None
    video_grid_thw: Any = None
    video_token_id: int | None = None

    @property
    def mm_token_type_ids(self) -> Any:
        """``[batch_size, seq_len]`` int32: 1 at image tokens (``<|image_pad|>``), 2 at video
        tokens (``<|video_pad|>``), else 0, as the processor returns it and the model's M-RoPE
        reads it."""
        ids = self.input_ids
        if torch is not None:
            kind = (ids == self.image_token_id).to(torch.int32)
            if self.video_token_id is not None:
                kind += 2 * (ids == self.video_token_id).to(torch.int32)
            return kind
        kind = (ids == self.image_token_id).astype(np.int32)
        if self.video_token_id is not None:
            kind += 2 * (ids == self.video_token_id).astype(np.int32)
        return kind

    @property
    def packed_position_ids(self) -> Any:
        """``[4, batch_size, seq_len]`` int64: ``position_ids`` then the three M-RoPE rows, as
        transformers' Qwen2-VL takes the positions of a packed batch (``position_ids`` of that
        shape, no ``attention_mask``): each document's run attends to itself alone and is
        positioned as if alone."""
        if torch is None:
            return np.concatenate([self.position_ids[None], self._mrope()])
        return torch.cat([torch.as_tensor(self.position_ids)[None], torch.as_tensor(self._mrope())])

    def _mrope(self) -> Any:
        if self.mrope_position_ids is not None:
            return self.mrope_position_ids
        p = self.position_ids
        return p[None].expand(3, -1, -1) if torch is not None else np.broadcast_to(p[None], (3, *p.shape))

    @property
    def padding(self) -> int:
        """Padding tokens in this batch."""
        return int(self.input_ids.numel() if torch is not None else self.input_ids.size) - self.tokens


#: The Qwen2-VL image processor's normalisation (OpenAI CLIP's mean and std).
QWEN_VL_MEAN = (0.48145466, 0.4578275, 0.40821073)
QWEN_VL_STD = (0.26862954, 0.26130258, 0.27577711)


class QwenVLCollator:
    """An :class:`InterleavedBatch` as ``Qwen2VLForConditionalGeneration`` takes it, for
    :class:`~shardstream.integrations.hf.ShardTrainer` or a loop of your own: ``input_ids``,
    ``labels``, ``mm_token_type_ids``, ``image_grid_thw`` and ``pixel_values`` rescaled to [0, 1]
    and normalised per channel (the processor's ``image_mean`` and ``image_std``), on ``device``
    (the pixels are moved as uint8 and normalised there); a batch with videos gives
    ``pixel_values_videos`` (normalised the same way, as the video processor's defaults) and
    ``video_grid_thw`` too. A batch without images gives neither ``pixel_values`` nor
    ``image_grid_thw``.

    Packed rows are isolated: ``position_ids`` is the batch's ``[4, batch_size, seq_len]``
    :attr:`~InterleavedBatch.packed_position_ids` and no ``attention_mask`` is given, so the
    model (transformers 5.x) masks attention between the documents of a row, for every attention
    implementation, and positions each as if alone: a document's logits are those it has fed
    alone. ``use_cache=False`` is given too: with a cache (the config's default, in training
    too) transformers skips the packed-sequence mask. ``cu_seqlens`` stays on the batch for a
    kernel of your own: passed to the model, its vision tower would take it for the images'
    (``vision_utils`` pops ``cu_seqlens``).

    Args:
        image_mean: Per-channel mean (default: the Qwen2-VL processor's).
        image_std: Per-channel standard deviation.
        dtype: Of the normalised pixels.
        device: Where the tensors go (default: where they are).
    """

    def __init__(
        self,
        image_mean: Sequence[float] = QWEN_VL_MEAN,
        image_std: Sequence[float] = QWEN_VL_STD,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        if torch is None:  # pragma: no cover - the collator feeds a torch model
            raise ImportError("QwenVLCollator needs torch")
        self.mean = torch.tensor(image_mean, dtype=torch.float32)
        self.std = torch.tensor(image_std, dtype=torch.float32)
        self.dtype = dtype or torch.float32
        self.device = device

    def __call__(self, batch: InterleavedBatch) -> dict[str, Any]:
        move = (lambda t: t.to(self.device, non_blocking=True)) if self.device is not None else (lambda t: t)
        out = {
            "input_ids": move(batch.input_ids),
            "labels": move(batch.labels),
            "mm_token_type_ids": move(batch.mm_token_type_ids),
            # Moved apart (pinned rows stay pinned), joined where they land.
            "position_ids": torch.cat([move(batch.position_ids)[None], move(batch._mrope())]),
            # With a cache (the config's default, in training too) transformers skips the
            # packed-sequence mask: documents would attend across.
            "use_cache": False,
        }
        if batch.pixel_values_videos is not None and len(batch.pixel_values_videos):
            out["pixel_values_videos"] = self._normalised(move(batch.pixel_values_videos))
            out["video_grid_thw"] = move(batch.video_grid_thw)
        if len(batch.pixel_values) == 0:  # no image: the vision tower is not run for images
            return out
        out["pixel_values"] = self._normalised(move(batch.pixel_values))
        out["image_grid_thw"] = move(batch.image_grid_thw)
        return out

    def _normalised(self, pixels: Any) -> Any:
        rows, width = pixels.shape
        x = pixels.float().div_(255).view(rows, 3, width // 3)
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        x = (x - mean[None, :, None]) / std[None, :, None]
        return x.view(rows, width).to(self.dtype)


class InterleavedLoader(UnitPlanLoader):
    """Iterable of :class:`InterleavedBatch`: interleaved documents packed into token rows with
    their images, exact across ranks and DataLoader workers, resumable mid-epoch onto another
    world size.

    An image whose header parsed but which fails to decode is dropped from its batch and counted
    in ``stats["skipped"]``: its tokens become padding (masked), the rest of its document stays,
    and every rank still yields the same batches.

    Args:
        counts: The corpus's :class:`InterleavedCounts` (or the path of a saved one), from
            :func:`count_interleaved`: its tokenizer, spec and batch shape are the loader's.
        seed: Seeds the order of units in an epoch.
        pad_token_id: The id padding is written with (its label is -100); default: the EOS.
        rank: This process's rank; default: ``torch.distributed`` when initialised, else the
            ``RANK`` environment variable, else 0.
        world_size: Ranks; default as ``rank``.
        threads: Threads tokenizing and decoding (default: this process's share of the cores).
        prefetch: Batches filled ahead of the one being used.
        pin_memory: Batches in pinned memory; default: when CUDA is available.
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        ValueError: the corpus holds fewer batches than ranks, or the tokenizer file changed.
    """

    def __init__(
        self,
        counts: InterleavedCounts | str | os.PathLike[str],
        *,
        seed: int = 0,
        pad_token_id: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        threads: int | None = None,
        prefetch: int = 2,
        pin_memory: bool | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        c = self._load_counts(counts)
        self.spec = c.spec
        self.seq_len = int(c.settings["seq_len"])
        self.batch_size = int(c.settings["batch_size"])
        source_config = self._start_plan(seed, rank, world_size, threads, prefetch, pin_memory, source)
        self._config = {**source_config, **_core_config(c.tokenizer, c.settings)}
        fingerprint, eos, vision, video_pad = _core.interleaved_tokens(self._config)
        #: The (vision start, vision end, image pad) token ids.
        self.vision_token_ids: tuple[int, int, int] = tuple(vision)
        self._image_token_id = vision[2]
        #: The id of the video pad token (None: the spec reads no video).
        self.video_token_id: int | None = video_pad
        if fingerprint != c.fingerprint:
            raise ValueError(
                f"the tokenizer {c.tokenizer} is not the one these counts were made with (its "
                "bytes or EOS changed): count again"
            )
        self.pad_token_id = eos if pad_token_id is None else int(pad_token_id)
        self._config["pad_id"] = self.pad_token_id
        self._pixel_bytes = int(c.settings["max_patches_per_batch"]) * self.spec.row_len
        self._require_a_batch_per_rank(
            f"the corpus packs into {self._total} batches of {self.batch_size} x {self.seq_len}, "
            f"fewer than the {self.world_size} ranks"
        )

    _counts_type = InterleavedCounts
    # A document spans batches: as a mixture's source, a resume reads every batch left.
    _pads_later_phases = True

    def _shape(self) -> tuple[int, int, int, int, int]:
        return (self.world_size, self._num_workers, 1, 1, 1)

    def _layout(self) -> tuple[tuple[tuple[int, ...], Any], tuple[tuple[int, ...], Any] | None]:
        # ids, labels, position_ids, then the three M-RoPE rows.
        return ((self._pixel_bytes,), np.uint8), ((6, self.batch_size, self.seq_len), np.int64)

    def _iterate(self, worker: int, workers: int) -> Iterator[InterleavedBatch]:
        config = dict(self._config, threads=self.threads)
        core = _core.interleaved_pipeline(self._units, self._weights, self._reader(worker), config)
        yield from self._pass(core, workers, self._make_batch)

    def _make_batch(self, result: Any, pixels: Any, ints: Any) -> tuple[InterleavedBatch, None]:
        patches, grids, cu_seqlens, max_seqlen, documents, keys, tokens, is_video = result
        as_tensor = torch.tensor if torch is not None else np.asarray
        int32 = torch.int32 if torch is not None else np.int32
        int64 = torch.int64 if torch is not None else np.int64
        rows = pixels[: patches * self.spec.row_len].reshape(patches, self.spec.row_len)
        grid_array = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        videos = np.asarray(is_video, dtype=bool)
        images_rows, video_rows, video_grids = rows, None, None
        if videos.any():
            # The rows lie in run order: each grid's patches, an image's or a video's.
            per_row = np.repeat(videos, grid_array.prod(axis=1))
            take = torch.as_tensor(per_row) if torch is not None else per_row
            images_rows, video_rows = rows[~take], rows[take]
            video_grids = as_tensor(grid_array[videos], dtype=int64)
            grid_array = grid_array[~videos]
        batch = InterleavedBatch(
            input_ids=ints[0],
            labels=ints[1],
            position_ids=ints[2],
            pixel_values=images_rows,
            image_grid_thw=as_tensor(grid_array, dtype=int64),
            cu_seqlens=as_tensor(cu_seqlens, dtype=int32),
            max_seqlen=int(max_seqlen),
            documents=int(documents),
            keys=list(keys),
            tokens=int(tokens),
            image_token_id=self._image_token_id,
            mrope_position_ids=ints[3:6],
            pixel_values_videos=video_rows,
            video_grid_thw=video_grids,
            video_token_id=self.video_token_id,
        )
        return batch, None

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank: ``batches``, ``rows``,
        ``tokens`` (of documents), ``padding`` (tokens), ``documents`` (begun and learned),
        ``cut_documents`` (documents the epoch reads only in part, whose runs are therefore
        context without labels; counted by the rank that reads the first of them),
        ``padding_batches`` (batches of padding alone: in a :class:`~shardstream.VlmMixture`
        resumed onto another world size, the ranks short of a batch), ``images``, ``videos``,
        ``patches``, ``skipped`` (documents, and images dropped at decode, by reason),
        ``faults`` (the first 1,000, each with ``reason``, ``url``, ``key``, ``detail``),
        ``bytes``, ``retries``, ``decode_seconds``, ``measure_seconds``; and for the epoch:
        ``remainder_batches`` (read by no rank: the plan's remainder, and in a
        :class:`~shardstream.VlmMixture` the batches past its end) and ``exact`` (True)."""
        stats = dict(self._last_stats)
        stats["remainder_batches"] = self._unread_weight()
        stats["exact"] = True
        return stats
