"""Mixtures of text corpora by token weight: e.g. FineWeb-Edu 0.7 and The Stack 0.3, every batch
holding each corpus's share of rows (stratified per batch, exactly), resumable.

Each corpus is read by its own :class:`~shardstream.TextLoader` (``plan::unit_stream``); how shares,
epochs and states work is :mod:`shardstream.kinds.row_mixture`'s, written once for every mixture.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from shardstream.config import SourceOptions
from shardstream.kinds.row_mixture import RowMixture
from shardstream.kinds.text import TextBatch, TextLoader, TokenCounts


@dataclass(frozen=True)
class TextSource:
    """One corpus of a :class:`TextMixture`.

    Attributes:
        counts: Its :class:`~shardstream.TokenCounts`, or the path of a saved one.
        weight: Its share of every batch's tokens, relative to the other sources' weights.
        name: What its stats are reported under (default: ``source{i}``).
    """

    counts: TokenCounts | str | os.PathLike[str]
    weight: float
    name: str | None = None


class TextMixture(RowMixture):
    """Iterable of :class:`~shardstream.TextBatch` mixing text corpora by token weight.

    Args:
        sources: The corpora (:class:`TextSource`), all counted with the same tokenizer.
        batch_size: Rows per batch on one rank, over all sources.
        seq_len: Tokens per row.
        seed: Seeds every source's order (each source derives its own from it).
        block_rows: Rows per shuffle block of each source (see :class:`~shardstream.TextLoader`).
        boundaries: Also yield ``position_ids`` and ``cu_seqlens``.
        dtype: ``"int64"`` or ``"int32"``.
        rank: This process's rank (default as :class:`~shardstream.TextLoader`).
        world_size: Ranks (default as :class:`~shardstream.TextLoader`).
        threads: Tokenizing threads, shared out between the sources (default: this process's
            share of the cores).
        source: How files are fetched (S3 endpoint, cache, ...).

    Raises:
        OptionError: a weight is not positive, or a source would get no row of a batch.
        ValueError: the sources were counted with different tokenizers.
    """

    STATE_FORMAT = "shardstream-text-mixture-state"

    def __init__(
        self,
        sources: Sequence[TextSource],
        *,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        block_rows: int = 256,
        boundaries: bool = False,
        dtype: str = "int64",
        rank: int | None = None,
        world_size: int | None = None,
        threads: int | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        super().__init__(sources, batch_size)
        self.loaders = []
        for i, (s, rows) in enumerate(zip(sources, self.rows, strict=True)):
            counts = s.counts if isinstance(s.counts, TokenCounts) else TokenCounts.load(s.counts)
            self.loaders.append(
                TextLoader(
                    counts,
                    batch_size=rows,
                    seq_len=seq_len,
                    seed=self._source_seed(seed, i),
                    block_rows=block_rows,
                    boundaries=boundaries,
                    dtype=dtype,
                    rank=rank,
                    world_size=world_size,
                    threads=self._thread_share(threads),
                    source=source,
                )
            )
        self._check_one_tokenizer([loader.counts.fingerprint for loader in self.loaders])
        self.seq_len, self.boundaries = seq_len, boundaries

    def _join(self, parts: list[TextBatch]) -> TextBatch:
        import torch

        ids = torch.cat([torch.as_tensor(p.input_ids) for p in parts])
        if not self.boundaries:
            return TextBatch(ids)
        positions = torch.cat([torch.as_tensor(p.position_ids) for p in parts])
        cu = torch.tensor(self._joined_cu_seqlens(parts), dtype=torch.int32)
        return TextBatch(ids, positions, cu, max(int(p.max_seqlen) for p in parts))
