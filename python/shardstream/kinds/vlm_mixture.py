"""The VLM mixture: interleaved documents, multi-image conversations, image-caption pairs (as
one-image documents) and text corpora in one epoch by token weight, every batch holding each
source's share of rows (stratified per batch, exactly), resumable; how shares, epochs and states
work is :mod:`shardstream.kinds.row_mixture`'s.

Each image-text source is read by its own :class:`~shardstream.InterleavedLoader`, which packs a
unit into batches of its own rows at count time: so such a source is counted
(:func:`~shardstream.count_interleaved`) with ``batch_size`` equal to its rows of the mixture's
batch, which :func:`vlm_rows` tells before counting. A text source is read by a
:class:`~shardstream.TextLoader` with its rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardstream.config import SourceOptions
from shardstream.errors import OptionError
from shardstream.kinds.interleaved import IGNORE_INDEX, InterleavedBatch, InterleavedCounts, InterleavedLoader
from shardstream.kinds.row_mixture import RowMixture, check_weights
from shardstream.kinds.text import TextBatch, TextLoader, TokenCounts


@dataclass(frozen=True)
class VlmSource:
    """One source of a :class:`VlmMixture`.

    Attributes:
        counts: Its :class:`~shardstream.InterleavedCounts` (interleaved documents,
            conversations or caption pairs) or :class:`~shardstream.TokenCounts` (a text
            corpus), or the path of a saved one.
        weight: Its share of every batch's tokens, relative to the other sources' weights.
        name: What its stats are reported under (default: ``source{i}``).
    """

    counts: InterleavedCounts | TokenCounts | str | os.PathLike[str]
    weight: float
    name: str | None = None


def vlm_rows(weights: Sequence[float], batch_size: int) -> list[int]:
    """Each source's rows of a ``batch_size``-row batch, as :class:`VlmMixture` gives them: the
    ``batch_size`` to count each image-text source with.

    Args:
        weights: The sources' weights, in order.
        batch_size: Rows per batch over all sources.

    Returns:
        Rows per source.
    """
    return check_weights([f"source{i}" for i in range(len(weights))], weights, batch_size)


def _load_counts(counts: Any) -> InterleavedCounts | TokenCounts:
    if isinstance(counts, (InterleavedCounts, TokenCounts)):
        return counts
    path = os.fspath(counts)
    opener = __import__("gzip").open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        fmt = json.load(f).get("format")
    kind = InterleavedCounts if fmt == InterleavedCounts.FORMAT else TokenCounts
    return kind.load(path)


class _PaddingRows(NamedTuple):
    """A text source's part of a batch where it has no batch left: rows of padding, no labels."""

    input_ids: Any
    position_ids: Any
    cu_seqlens: Any
    max_seqlen: int


class VlmMixture(RowMixture):
    """Iterable of :class:`~shardstream.InterleavedBatch` mixing image-text and text sources by
    token weight: rows ``0 .. rows_0`` of every batch are source 0's, the next ``rows_1``
    source 1's, and so on.

    A text source's rows take the interleaved kind's conventions: their labels are the ids with
    -100 on the first token of each sequence (the text kind's rows hold no padding), and they hold
    no images. ``documents`` and ``keys`` count the image-text sources' documents alone;
    ``tokens`` all sources'.

    Args:
        sources: The sources (:class:`VlmSource`), at least one an image-text one; all counted
            with the same tokenizer, the image-text ones with the same ``seq_len`` and spec, each
            with ``batch_size`` equal to its rows (:func:`vlm_rows`).
        batch_size: Rows per batch on one rank, over all sources.
        seed: Seeds every source's order (each source derives its own from it).
        pad_token_id: The id padding is written with (as :class:`~shardstream.InterleavedLoader`).
        rank: This process's rank (default as :class:`~shardstream.InterleavedLoader`).
        world_size: Ranks (default as :class:`~shardstream.InterleavedLoader`).
        threads: Threads, shared out between the sources (default: this process's share of the
            cores).
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        OptionError: a weight is not positive, a source would get no row of a batch, or an
            image-text source was counted with another ``batch_size`` than its rows.
        ValueError: the sources were counted with different tokenizers, ``seq_len`` or specs,
            or none is an image-text source.
    """

    STATE_FORMAT = "shardstream-vlm-mixture-state"

    def __init__(
        self,
        sources: Sequence[VlmSource],
        *,
        batch_size: int,
        seed: int = 0,
        pad_token_id: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        threads: int | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        super().__init__(sources, batch_size)
        counts = [_load_counts(s.counts) for s in sources]
        vlm = [c for c in counts if isinstance(c, InterleavedCounts)]
        if not vlm:
            raise ValueError("a VlmMixture needs at least one image-text source (InterleavedCounts)")
        first = vlm[0].settings
        for name, c, rows in zip(self.names, counts, self.rows, strict=True):
            if isinstance(c, InterleavedCounts):
                if int(c.settings["batch_size"]) != rows:
                    detail = f"source {name!r} has {rows} rows of each batch: count it with batch_size={rows}"
                    raise OptionError("batch_size", f"{detail}, not {c.settings['batch_size']}")
                for key in ("seq_len", "spec"):
                    if c.settings[key] != first[key]:
                        raise ValueError(f"source {name!r} was counted with another {key} than the first")
        self._check_one_tokenizer([c.fingerprint for c in counts])
        self.seq_len = int(first["seq_len"])
        share = self._thread_share(threads)
        common = {"rank": rank, "world_size": world_size, "threads": share, "source": source}
        self.loaders: list[Any] = []
        for i, (c, rows) in enumerate(zip(counts, self.rows, strict=True)):
            seed_i = self._source_seed(seed, i)
            if isinstance(c, InterleavedCounts):
                self.loaders.append(InterleavedLoader(c, seed=seed_i, pad_token_id=pad_token_id, **common))
            else:
                loader = TextLoader(
                    c, batch_size=rows, seq_len=self.seq_len, seed=seed_i, boundaries=True, **common
                )
                self.loaders.append(loader)
        self._image_token_id = self.loaders[counts.index(vlm[0])]._image_token_id
        # Every source plans its stream only up to the mixture's end, so that every batch it
        # plans is read, on every world size and after every resume: a document cut by that end
        # is then known to its reader, which leaves it unlearned (see the mixtures guide).
        for loader in self.loaders:
            loader._epoch_batches = self._epoch_batches
        self._pad_token_id = self.loaders[counts.index(vlm[0])].pad_token_id
        self._text_padding: dict[int, int] = {}

    def __len__(self) -> int:
        """Batches this rank yields in the current pass: the image-text sources' (after a
        resume onto another world size they read every batch left, some ranks one of padding;
        a text source short of them is padded, see :meth:`_next_part`)."""
        return min(len(loader) for loader in self.loaders if isinstance(loader, InterleavedLoader))

    def _next_part(self, source: int, it: Any) -> Any:
        """A text source's next batch, or rows of padding where it has none left: after a resume
        onto another world size its remainder (fewer tokens than a batch per rank) is left
        unread, as packed text leaves it, while the image-text sources read every batch left
        so that a document begun before the stop is read to its end."""
        part = next(it, None)
        if part is None and not isinstance(self.loaders[source], InterleavedLoader):
            self._text_padding[source] = self._text_padding.get(source, 0) + 1
            return self._padding_rows(self.rows[source])
        if part is None:
            raise RuntimeError(f"source {self.names[source]!r} ended before the mixture's batches")
        return part

    def _padding_rows(self, rows: int) -> _PaddingRows:
        """``rows`` rows of padding, each one sequence (as the interleaved kind pads a row)."""
        import torch

        ids = torch.full((rows, self.seq_len), self._pad_token_id, dtype=torch.int64)
        positions = torch.arange(self.seq_len, dtype=torch.int64).expand(rows, -1).contiguous()
        cu = torch.arange(0, (rows + 1) * self.seq_len, self.seq_len, dtype=torch.int32)
        return _PaddingRows(ids, positions, cu, self.seq_len)

    def _source_done(self, source: int, done: int) -> int:
        """A text source read no more batches this pass than it has (the rest were padding)."""
        loader = self.loaders[source]
        return done if isinstance(loader, InterleavedLoader) else min(done, len(loader))

    def _begin_pass(self) -> None:
        super()._begin_pass()
        self._text_padding = {}

    def _worker_stats(self) -> dict[str, dict[str, Any]]:
        """The sources' counters, and the text sources' parts of padding: counted where they are
        made, in a DataLoader worker, and sent with the rest."""
        stats = super()._worker_stats()
        stats["text_padding"] = {str(i): n for i, n in self._text_padding.items()}
        return stats

    def _merge_worker_stats(self, per_worker: list[dict[str, dict[str, Any]]]) -> None:
        super()._merge_worker_stats(per_worker)
        totals: dict[int, int] = {}
        for counters in per_worker:
            for i, n in counters.get("text_padding", {}).items():
                totals[int(i)] = totals.get(int(i), 0) + int(n)
        self._text_padding = totals

    @property
    def stats(self) -> dict[str, Any]:
        """As :attr:`RowMixture.stats`; a text source's ``padding_batches`` counts its parts of
        padding this pass (the image-text sources count theirs in their own stats)."""
        stats = super().stats
        for i, name in enumerate(self.names):
            if not isinstance(self.loaders[i], InterleavedLoader):
                stats["sources"][name]["padding_batches"] = self._text_padding.get(i, 0)
        return stats

    def _epoch_batches(self, world_size: int) -> int:
        """Batches per rank of an epoch whose first phase runs on ``world_size`` ranks: as many
        as the source with the fewest allows."""
        return min(loader._batches_on(world_size) for loader in self.loaders)

    def _join(self, parts: list[InterleavedBatch | TextBatch | _PaddingRows]) -> InterleavedBatch:
        import torch

        ids, labels, positions, mrope, pixels, grids, keys = [], [], [], [], [], [], []
        video_pixels, video_grids, video_token_id = [], [], None
        documents = tokens = 0
        for p in parts:
            ids.append(torch.as_tensor(p.input_ids))
            positions.append(torch.as_tensor(p.position_ids))
            if isinstance(p, InterleavedBatch):
                mrope.append(torch.as_tensor(p._mrope()))
                labels.append(torch.as_tensor(p.labels))
                pixels.append(torch.as_tensor(p.pixel_values))
                grids.append(torch.as_tensor(p.image_grid_thw))
                if p.pixel_values_videos is not None:
                    video_pixels.append(torch.as_tensor(p.pixel_values_videos))
                    video_grids.append(torch.as_tensor(p.video_grid_thw))
                video_token_id = p.video_token_id if p.video_token_id is not None else video_token_id
                keys.extend(p.keys)
                documents += p.documents
                tokens += p.tokens
            elif isinstance(p, _PaddingRows):
                mrope.append(positions[-1][None].expand(3, -1, -1))
                labels.append(torch.full_like(ids[-1], IGNORE_INDEX))
            else:
                # Text alone: M-RoPE's three rows are its 1-D positions (get_rope_index's rule).
                mrope.append(positions[-1][None].expand(3, -1, -1))
                label = torch.as_tensor(p.input_ids).clone()
                # Each sequence's first token is not predicted across a boundary (as the
                # interleaved rows): its label is masked.
                label.view(-1)[torch.as_tensor(p.cu_seqlens[:-1], dtype=torch.int64)] = IGNORE_INDEX
                labels.append(label)
                tokens += label.numel()
        return InterleavedBatch(
            input_ids=torch.cat(ids),
            labels=torch.cat(labels),
            position_ids=torch.cat(positions),
            pixel_values=torch.cat(pixels),
            image_grid_thw=torch.cat(grids),
            cu_seqlens=torch.tensor(self._joined_cu_seqlens(parts), dtype=torch.int32),
            max_seqlen=max(int(p.max_seqlen) for p in parts),
            documents=documents,
            keys=keys,
            tokens=tokens,
            image_token_id=self._image_token_id,
            mrope_position_ids=torch.cat(mrope, dim=1),
            pixel_values_videos=torch.cat(video_pixels) if video_pixels else None,
            video_grid_thw=torch.cat(video_grids) if video_grids else None,
            video_token_id=video_token_id,
        )
