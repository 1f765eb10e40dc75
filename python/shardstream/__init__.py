"""shardstream: fast, exact, fault-tolerant WebDataset streaming for distributed training.

The public API, by topic (every name below is in ``__all__``):

Loading batches
    :class:`ShardLoader` (batches of decoded images and captions), :class:`Batch` (one batch),
    :class:`LoaderConfig` (what the loader decodes and reads with, field by field),
    :class:`SourceOptions` (how shards are fetched: S3, TLS, backoff, cache), :class:`Source`
    (one dataset of a mixture), :data:`DEFAULTS` (the core's defaults).

Text corpora (the packed text kind, :mod:`shardstream.kinds.text`)
    :func:`count_tokens` (each unit's tokens under a tokenizer, once), :class:`TokenCounts`,
    :class:`TextLoader` (documents packed into token rows, exact across ranks),
    :class:`TextBatch` (one batch of rows), :class:`TextMixture` and :class:`TextSource` (corpora
    mixed by token weight, stratified per batch).

Sample kinds
    :class:`NaFlex` (``ShardLoader(..., sample=NaFlex(...))``: images at their own aspect ratio as
    SigLIP 2 patch sequences) and its batch, :class:`NaFlexBatch` (from ``shardstream.kinds``);
    its token-budget batches (:mod:`shardstream.kinds.naflex_budget`): :func:`count_patches`
    (each unit's batches under a patch budget, once), :class:`PatchCounts` and
    :class:`NaFlexBudgetLoader` (as many images per batch as fit the budget, exact across
    ranks); interleaved image-text documents for VLMs (:mod:`shardstream.kinds.interleaved`):
    :func:`count_interleaved`, :class:`InterleavedCounts`, :class:`InterleavedLoader`,
    :class:`InterleavedBatch`, the image rules :class:`QwenVL` (Qwen2-VL) and :class:`NaFlexVL`
    (SigLIP 2), the collator
    :class:`QwenVLCollator`; its layouts :class:`Conversations` (multi-image LLaVA
    conversations) and :class:`Captions` (image-caption pairs); and :class:`VlmMixture`
    (interleaved, caption and text sources mixed by token weight in every batch); video-text
    CLIP clips (:mod:`shardstream.kinds.video`): :func:`count_clips` (each unit's clips, from
    their headers, once), :class:`ClipCounts`, :class:`VideoLoader` (``uint8 [B, T, 3, S, S]``
    clips decoded at their sampled frames, exact across ranks) and :class:`VideoBatch`.

Raw samples, writing and indexing
    :func:`read_samples` (raw samples, no decoding), :class:`ShardWriter` (deterministic tar
    shards), :func:`build_index` and :func:`write_index` (the index that makes epochs exact).

Errors
    :class:`ShardError` and its subclasses :class:`SourceError`, :class:`CredentialsError`,
    :class:`NotFoundError`, :class:`BadUrlError`, :class:`SampleError`; :class:`OptionError` (a
    refused option value) and :class:`MissingDependencyError` (an optional package to install);
    :class:`UnreadableUnitsWarning` (a count left out units it could not read).

Framework adapters live in ``shardstream.integrations``; the CLIP trainer in ``shardstream.train``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardstream._core import __version__
from shardstream.config import DEFAULTS, LoaderConfig, SourceOptions
from shardstream.errors import (
    BadUrlError,
    CredentialsError,
    MissingDependencyError,
    NotFoundError,
    OptionError,
    SampleError,
    ShardError,
    SourceError,
    UnreadableUnitsWarning,
)
from shardstream.index import build_index, write_index
from shardstream.kinds import NaFlex, NaFlexBatch
from shardstream.planned_mixture import Source
from shardstream.samples import read_samples
from shardstream.writer import ShardWriter

if TYPE_CHECKING:
    from shardstream.kinds.captions import Captions
    from shardstream.kinds.conversations import Conversations
    from shardstream.kinds.interleaved import (
        InterleavedBatch,
        InterleavedCounts,
        InterleavedLoader,
        NaFlexVL,
        QwenVideo,
        QwenVL,
        QwenVLCollator,
        count_interleaved,
    )
    from shardstream.kinds.naflex_budget import NaFlexBudgetLoader, PatchCounts, count_patches
    from shardstream.kinds.text import TextBatch, TextLoader, TokenCounts, count_tokens
    from shardstream.kinds.text_mixture import TextMixture, TextSource
    from shardstream.kinds.video import ClipCounts, VideoBatch, VideoLoader, count_clips
    from shardstream.kinds.vlm_mixture import VlmMixture, VlmSource, vlm_rows
    from shardstream.loader import Batch, ShardLoader

__all__ = [
    # loading batches
    "ShardLoader",
    "Batch",
    "LoaderConfig",
    "SourceOptions",
    "Source",
    "DEFAULTS",
    # text corpora
    "count_tokens",
    "TokenCounts",
    "TextLoader",
    "TextBatch",
    "TextMixture",
    "TextSource",
    # sample kinds
    "NaFlex",
    "NaFlexBatch",
    "count_patches",
    "PatchCounts",
    "NaFlexBudgetLoader",
    "count_interleaved",
    "InterleavedCounts",
    "InterleavedLoader",
    "InterleavedBatch",
    "QwenVL",
    "QwenVideo",
    "NaFlexVL",
    "QwenVLCollator",
    "Conversations",
    "Captions",
    "VlmMixture",
    "VlmSource",
    "vlm_rows",
    "count_clips",
    "ClipCounts",
    "VideoLoader",
    "VideoBatch",
    # raw samples, writing and indexing
    "read_samples",
    "ShardWriter",
    "build_index",
    "write_index",
    # errors
    "ShardError",
    "SourceError",
    "CredentialsError",
    "NotFoundError",
    "BadUrlError",
    "SampleError",
    "OptionError",
    "MissingDependencyError",
    "UnreadableUnitsWarning",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # The loader imports torch (seconds); the CLI and read_samples do not need it.
    if name in ("ShardLoader", "Batch"):
        from shardstream import loader

        return getattr(loader, name)
    if name in ("count_tokens", "TokenCounts", "TextLoader", "TextBatch"):
        from shardstream.kinds import text

        return getattr(text, name)
    if name in ("count_patches", "PatchCounts", "NaFlexBudgetLoader"):
        from shardstream.kinds import naflex_budget

        return getattr(naflex_budget, name)
    if name in ("count_clips", "ClipCounts", "VideoLoader", "VideoBatch"):
        from shardstream.kinds import video

        return getattr(video, name)
    if name in (
        "count_interleaved",
        "InterleavedCounts",
        "InterleavedLoader",
        "InterleavedBatch",
        "QwenVL",
        "QwenVideo",
        "NaFlexVL",
        "QwenVLCollator",
    ):
        from shardstream.kinds import interleaved

        return getattr(interleaved, name)
    if name == "Conversations":
        from shardstream.kinds.conversations import Conversations

        return Conversations
    if name == "Captions":
        from shardstream.kinds.captions import Captions

        return Captions
    if name in ("VlmMixture", "VlmSource", "vlm_rows"):
        from shardstream.kinds import vlm_mixture

        return getattr(vlm_mixture, name)
    if name in ("TextMixture", "TextSource"):
        from shardstream.kinds import text_mixture

        return getattr(text_mixture, name)
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
