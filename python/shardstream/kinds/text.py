"""Text corpora packed into token rows: FineWeb-, The Stack- or StarCoder-style Parquet files,
JSONL files (plain, ``.gz`` or ``.zst``: FineWeb, DCLM, The Stack v2, C4) and tars of text
members, from disk, HTTP, S3 or ``hf://``, tokenized by a Hugging Face
``tokenizer.json`` in Rust threads and packed into ``[B, seq_len]`` rows.

Two steps, as for images (an index, then a loader):

1. :func:`count_tokens` reads every document once and records how many tokens each unit (a
   Parquet row group, a JSONL file, a tar shard) encodes to under the tokenizer: a small JSON file
   (:class:`TokenCounts`), O(units), never O(documents).
2. :class:`TextLoader` cuts the epoch's token stream into equal shares per rank from those
   counts (``plan::unit_stream`` in the Rust core): every rank yields the same number of full rows,
   every token of every document is in exactly one row per epoch (except the remainder,
   shorter than one global batch, reported in ``stats``), and ``state_dict`` /
   ``load_state_dict`` continue at the exact next token, also onto another world size.

Documents are concatenated, each followed by the EOS (and preceded by a BOS when named), and cut
into rows, as Megatron and LitData pack; a document longer than a row spans rows. With
``boundaries=True`` each batch also carries ``position_ids`` restarting at every document and
``cu_seqlens`` for FlashAttention's varlen kernels, so attention need never cross documents.
"""

from __future__ import annotations

import os
from collections import Counter
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

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

COUNTS_FORMAT = "shardstream-token-counts"
COUNTS_VERSION = 1
#: Documents larger than this many bytes are skipped (``member_too_large``), never loaded whole.
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20


@dataclass(frozen=True)
class TokenCounts(counts_file.DocumentCounts):
    """How many tokens every unit of a corpus encodes to under one tokenizer: what
    :class:`TextLoader` plans an epoch with. Made by :func:`count_tokens`; saved and loaded as
    JSON (gzip when the path ends in ``.gz``).

    Attributes:
        tokenizer: Path of the ``tokenizer.json`` the tokens were counted with.
        fingerprint: Identifies that file's bytes with the EOS and BOS; a loader whose tokenizer
            differs refuses the counts.
        text_key: Where each document's text is: a Parquet string column, a JSONL field or a tar
            member's extension (``text``, ``txt``, ``py``), or ``json:FIELD`` (a field of the
            JSON member, or of a JSONL line).
        eos_token: The token after every document (None: the tokenizer's usual EOS).
        bos_token: The token before every document, or None.
        max_document_bytes: Larger documents were skipped (and are skipped by the loader).
        units: One dict per unit in corpus order: ``url``, ``display``, ``first_row``, ``rows``
            (None for a tar or a JSONL file), ``identity`` (the file's ETag or size when
            counted, which the loader pins its reads to), ``version`` (the file's content
            identity as probed before counting: what ``previous=`` compares), ``documents``,
            ``tokens``, ``skipped`` (reason to count).
        failed: Units that could not be read at all, with their ``error`` (reason, detail):
            they hold no tokens, so no epoch reads them.
    """

    tokenizer: str
    fingerprint: str
    text_key: str
    eos_token: str | None
    bos_token: str | None
    max_document_bytes: int
    units: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)

    FORMAT: ClassVar[str] = COUNTS_FORMAT
    VERSION: ClassVar[int] = COUNTS_VERSION
    WHAT: ClassVar[str] = "token counts"
    WEIGHT: ClassVar[str] = "tokens"

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole corpus (every document, with its EOS/BOS)."""
        return self._sum("tokens")

    def _identity_head(self) -> bytes:
        return self.fingerprint.encode()


def count_tokens(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: str | os.PathLike[str],
    text_key: str = "text",
    eos_token: str | None = None,
    bos_token: str | None = None,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    threads: int | None = None,
    output: str | os.PathLike[str] | None = None,
    source: SourceOptions | None = None,
    on_error: OnError = "skip",
    previous: TokenCounts | str | os.PathLike[str] | None = None,
    distributed: bool = False,
) -> TokenCounts:
    """Counts the tokens of every unit of a text corpus, once, for :class:`TextLoader`.

    Every document is read and encoded exactly as the loader will (in Rust threads, without the
    GIL), so the plan's token positions are the loader's tokens.

    Args:
        urls: Parquet files, JSONL files and tar shards: a path, glob, brace pattern,
            ``http(s)://``, ``s3://`` or ``hf://`` URL, or a list of them (as
            :class:`~shardstream.ShardLoader`; a directory or prefix listing also takes
            ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``, ``.ndjson`` and ``.json.gz`` files). A
            Parquet file's units are its row groups; a JSONL file (one JSON object per line, one
            document per line, compressed by name or magic bytes) and a tar are one unit each.
        tokenizer: Path of a Hugging Face ``tokenizer.json`` (GPT-2, Llama 3, Qwen, StarCoder2,
            ...). Its ids are the ``tokenizers`` package's ``encode(text,
            add_special_tokens=False)``.
        text_key: A Parquet string column, a JSONL field (``text``; ``json:text`` too) or a
            tar member extension, or ``json:FIELD`` (a field of a tar sample's JSON member).
            A JSONL line that cannot be used is skipped and counted with its reason and key
            ``line N``: ``bad_json`` (not one JSON object), ``missing_text`` (the field absent or
            null, or a blank line), ``wrong_type`` (not a string), ``bad_utf8``,
            ``member_too_large`` (see ``max_document_bytes``); a truncated ``.gz``/``.zst``
            stream fails its file (``corrupt_stream``).
        eos_token: Token appended to every document; None: the first of ``<|endoftext|>``,
            ``</s>``, ``<|end_of_text|>``, ``<eos>``, ``<|im_end|>`` in the vocabulary.
        bos_token: Token put before every document; None: none.
        max_document_bytes: A larger document is skipped (reason ``member_too_large``), never
            held whole; for JSONL the limit is on the line (the JSON object around the text).
            64 MiB of text by default; an interleaved document's cap
            (:func:`count_interleaved`) is 256 MiB because it holds its images' bytes too.
        threads: Threads reading and tokenizing (default: this process's share of the cores).
        output: If given, the counts are also saved there (see :meth:`TokenCounts.save`).
        source: How the files are fetched (S3 endpoint, cache, ...).
        on_error: A unit that cannot be read at all (a file unreadable, a corrupt footer or
            stream, no ``text_key`` column): ``"skip"`` (default) leaves it out of the counts
            (in :attr:`TokenCounts.failed`) and warns, an
            :class:`~shardstream.UnreadableUnitsWarning` naming each such unit and its reason;
            ``"raise"`` raises a :class:`~shardstream.ShardError` naming the first one (nothing
            is saved). Documents skipped inside a unit are counted either way.
        previous: Counts of an earlier pass under the same settings (or their path): a file it
            holds whose content identity is unchanged (one ``stat`` or ``HEAD``, as
            ``shardstream index`` probes shards) keeps its units without being read; new,
            changed and failed files are counted, files no longer listed are dropped. The
            result equals a fresh count. Counts made under other settings are not reused (a
            warning says so), nor units without a ``version`` (counted by an older package).
        distributed: Split the files across the ranks of a torchrun job (``RANK`` and
            ``WORLD_SIZE``, or ``torch.distributed`` when initialised; gloo over CPU tensors):
            every rank must call this with the same arguments; each counts its share, rank 0
            merges (and reads ``previous``, writes ``output``), and every rank returns the same
            counts.

    Returns:
        The counts.

    Raises:
        ValueError: the tokenizer file does not load, ``text_key`` is empty, no file matches, or
            no unit holds a single token (every file failed, or every document was skipped): the
            message names the most common reason.
        ShardError: with ``on_error="raise"``, a unit could not be read.
    """
    from shardstream.urls import TEXT_SUFFIXES, expand_urls, source_config

    if max_document_bytes <= 0:
        raise OptionError("max_document_bytes", f"must be positive, not {max_document_bytes}")
    counts_file.check_on_error(on_error)
    options = (source or SourceOptions()).keywords()
    shards = expand_urls(urls, suffixes=TEXT_SUFFIXES, **options)
    if not shards:
        raise ValueError(f"no files match {urls!r}")
    config = source_config(shards, options)
    tokenizer = os.path.abspath(os.fspath(tokenizer))
    fingerprint, _, _ = _core.packed_encoder(tokenizer, eos_token, bos_token)
    threads = threads or default_loader_threads()

    def count(files: list[str], threads: int) -> list[dict[str, Any]]:
        return _core.count_tokens(
            files, tokenizer, text_key, eos_token, bos_token, max_document_bytes, threads, config
        )

    def build(units: list[dict[str, Any]], failed: list[dict[str, Any]]) -> TokenCounts:
        return TokenCounts(
            tokenizer, fingerprint, text_key, eos_token, bos_token, max_document_bytes, units, failed
        )

    def nothing(counts: TokenCounts) -> str | None:
        if counts.total_tokens:
            return None
        what = (
            repr(urls) if isinstance(urls, (str, os.PathLike)) or len(shards) == 1 else f"{len(shards)} files"
        )
        return f"no document of {what} encodes to a token: {_top_reason(counts)}"

    # The tokenizer's path may move: its fingerprint pins its bytes.
    kind = CountingKind("count_tokens", TokenCounts, count, build, nothing, unchecked=("tokenizer",))
    return count_units(
        kind,
        shards,
        threads=threads,
        source_options=options,
        on_error=on_error,
        previous=previous,
        output=output,
        distributed=distributed,
    )


def _top_reason(counts: TokenCounts) -> str:
    """The most common reason documents or files gave no tokens, for one-line errors: files
    that could not be read count once per file, skipped documents once each."""
    reasons: Counter[tuple[str, str]] = Counter()
    for reason, n in counts.skipped.items():
        reasons[(reason, "documents")] += n
    for reason in {(f["url"], f["error"]["reason"]) for f in counts.failed}:
        reasons[(reason[1], "files")] += 1
    if not reasons:
        return "the files hold no documents"
    (reason, what), n = reasons.most_common(1)[0]
    if what == "files":
        f = next(f for f in counts.failed if f["error"]["reason"] == reason)
        return f"{reason} in {n} files (e.g. {f['display']}: {f['error']['detail']})"
    example = next(
        (
            f"{e.get('url')} {e.get('key')}: {e.get('detail')}"
            for u in counts.units
            for e in u.get("examples", [])
            if e.get("reason") == reason
        ),
        None,
    )
    return f"{n} documents {reason}" + (f" (e.g. {example})" if example else "")


class TextBatch(NamedTuple):
    """One batch of packed rows.

    Attributes:
        input_ids: ``[B, seq_len]`` token ids (``torch.int64``, or ``int32`` with
            ``dtype="int32"``; numpy without torch). Rows are consecutive tokens of the corpus:
            documents, each followed by its EOS, cut at row ends.
        position_ids: With ``boundaries=True``: ``[B, seq_len]`` int64 positions restarting at 0
            at every document and at every row start; else None.
        cu_seqlens: With ``boundaries=True``: int32 cumulative sequence lengths over the flattened
            ``B * seq_len`` tokens (``0, len_0, len_0 + len_1, ..., B * seq_len``), as
            FlashAttention's varlen kernels take them; else None.
        max_seqlen: With ``boundaries=True``: the longest of those sequences; else None.
    """

    input_ids: Any
    position_ids: Any = None
    cu_seqlens: Any = None
    max_seqlen: int | None = None

    @property
    def labels(self) -> Any:
        """The labels a Hugging Face causal LM takes: ``input_ids`` itself, not shifted (the
        model shifts them by one inside its loss). Every position is a real token: packed rows
        hold no padding."""
        return self.input_ids


class TextLoader(UnitPlanLoader):
    """Iterable of :class:`TextBatch`: a text corpus packed into rows of ``seq_len`` tokens, with
    exact epochs across ranks.

    Args:
        counts: The corpus's :class:`TokenCounts` (or the path of a saved one), from
            :func:`count_tokens`. Its tokenizer, text key and EOS/BOS are the loader's.
        batch_size: Rows per batch on one rank (B).
        seq_len: Tokens per row (L).
        seed: Seeds the order of units in an epoch and the shuffle of rows within blocks.
        block_rows: Rows per shuffle block: each reader fills a block with consecutive rows of
            its share and emits them in a seeded order. Memory grows with ``block_rows x
            seq_len`` tokens (4 bytes each). 1 keeps the stream's order.
        boundaries: Also yield ``position_ids`` and ``cu_seqlens`` (see :class:`TextBatch`).
        dtype: ``"int64"`` (default, what ``nn.Embedding`` takes) or ``"int32"``.
        rank: This process's rank; default: ``torch.distributed`` when initialised, else the
            ``RANK`` environment variable, else 0.
        world_size: Ranks; default as ``rank``.
        threads: Threads tokenizing (default: this process's share of the cores).
        prefetch: Batches filled ahead of the one being used.
        pin_memory: Batches in pinned memory; default: when CUDA is available.
        source: How files are fetched (S3 endpoint, cache, ...); as for :func:`count_tokens`.

    Raises:
        OptionError: a value is out of range (named in the message).
        ValueError: the counts' tokenizer file is missing or now encodes differently, or the
            corpus holds less than one global batch of tokens.

    Every rank yields ``len(loader)`` batches; the tokens of the epoch beyond the last full
    global batch are the remainder (``stats["remainder_tokens"]``). A unit whose documents no
    longer encode to its counted tokens (a file changed, another tokenizer) fails the pass
    naming the file.

    Attributes:
        counts: The :class:`TokenCounts` the epoch is planned from.
        fast_path: True when documents are encoded by shardstream's own byte-level BPE (for
            ``tokenizer.json`` files of the GPT-2, Llama 3 and Qwen2 kinds, with the same ids as
            the ``tokenizers`` library); False when by the ``tokenizers`` library itself.
        fast_path_reason: Why not the fast path (e.g. the pre-tokenizer or normalizer it does
            not handle), in one line; empty when ``fast_path`` is True.
        epoch: The epoch the next pass reads (see :meth:`set_epoch`).
    """

    _counts_type = TokenCounts

    def __init__(
        self,
        counts: TokenCounts | str | os.PathLike[str],
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
        prefetch: int = 2,
        pin_memory: bool | None = None,
        source: SourceOptions | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("block_rows", block_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise OptionError(name, f"must be a positive integer, not {value!r}")
        if dtype not in ("int64", "int32"):
            raise OptionError("dtype", f"must be 'int64' or 'int32', not {dtype!r}")
        c = self._load_counts(counts)
        if not os.path.isfile(c.tokenizer):
            raise ValueError(f"the token counts' tokenizer file {c.tokenizer!r} does not exist")
        fingerprint, _, _ = _core.packed_encoder(c.tokenizer, c.eos_token, c.bos_token)
        if fingerprint != c.fingerprint:
            raise ValueError(
                f"the tokenizer file {c.tokenizer!r} changed since the tokens were counted "
                f"(fingerprint {fingerprint}, counted with {c.fingerprint}): count again"
            )
        #: True when documents are encoded by the fast byte-level BPE path (same ids as the
        #: tokenizers library); False: by the library, for the reason in ``fast_path_reason``.
        self.fast_path, self.fast_path_reason = _core.packed_fast_path(c.tokenizer, c.eos_token, c.bos_token)
        self.batch_size, self.seq_len = batch_size, seq_len
        self.block_rows, self.boundaries, self.dtype = block_rows, boundaries, dtype
        source_config = self._start_plan(seed, rank, world_size, threads, prefetch, pin_memory, source)
        self._config = self._core_config(source_config)
        need = self.world_size * batch_size * seq_len
        self._require_a_batch_per_rank(
            f"the corpus holds {c.total_tokens} tokens, less than one global batch "
            f"({self.world_size} ranks x {batch_size} rows x {seq_len} tokens = {need})"
        )

    def _core_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` (how the units are opened) with the kind's settings."""
        c = self.counts
        config.update(
            tokenizer=c.tokenizer,
            text_key=c.text_key,
            eos_token=c.eos_token,
            bos_token=c.bos_token,
            max_document_bytes=c.max_document_bytes,
            int32=self.dtype == "int32",
            boundaries=self.boundaries,
        )
        return config

    # -- distribution and length ----------------------------------------------------------

    def _shape(self) -> tuple[int, int, int, int, int]:
        return (self.world_size, self._num_workers, self.batch_size, self.seq_len, self.block_rows)

    # -- iteration ------------------------------------------------------------------------
    def _layout(self) -> tuple[tuple[tuple[int, ...], Any], tuple[tuple[int, ...], Any] | None]:
        shape = (self.batch_size, self.seq_len)
        ids = (shape, np.int32 if self.dtype == "int32" else np.int64)
        return ids, ((shape, np.int64) if self.boundaries else None)

    def _iterate(self, worker: int, workers: int) -> Iterator[TextBatch]:
        core = _core.packed_pipeline(
            self._units,
            self._weights,
            self._reader(worker),
            dict(self._config, threads=self.threads),
        )
        yield from self._pass(core, workers, self._make_batch)

    def _make_batch(self, result: Any, ids: Any, pos: Any) -> tuple[TextBatch, None]:
        _, cu_seqlens, max_seqlen = result
        if not self.boundaries:
            return TextBatch(ids), None
        cu = (
            torch.tensor(cu_seqlens, dtype=torch.int32)
            if torch is not None
            else np.asarray(cu_seqlens, dtype=np.int32)
        )
        return TextBatch(ids, pos, cu, int(max_seqlen)), None

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank: ``batches``, ``rows``,
        ``tokens`` (written into rows), ``documents`` (begun in rows), ``skipped`` documents by
        reason and ``skipped_total``, ``faults`` (the first 1,000 skips, each a dict of
        ``reason``, ``url``, ``key`` and ``detail``), ``bytes``, ``retries`` (``throttled``:
        those that waited for a ``Retry-After``), ``resumes`` (reads resumed mid-file),
        ``tokenize_seconds``; and for the epoch: ``remainder_tokens`` (read by no rank),
        ``exact`` (True) and ``encoder`` (``"fast_bpe"`` or ``"tokenizers"``, see
        ``fast_path``)."""
        stats = dict(self._last_stats)
        stats["encoder"] = "fast_bpe" if self.fast_path else "tokenizers"
        stats["remainder_tokens"] = self._unread_weight()
        stats["exact"] = True
        return stats
