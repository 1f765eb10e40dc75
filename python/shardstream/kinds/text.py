"""Text corpora packed into token rows: FineWeb-, The Stack- or StarCoder-style Parquet files,
JSONL files (plain, ``.gz`` or ``.zst``: FineWeb, DCLM, The Stack v2, C4) and tars of text
members, from disk, HTTP, S3 or ``hf://``, tokenized by a Hugging Face
``tokenizer.json`` in Rust threads and packed into ``[B, seq_len]`` rows.

Two steps, as for images (an index, then a loader):

1. :func:`count_tokens` reads every document once and records how many tokens each unit (a
   Parquet row group, a JSONL file, a tar shard) encodes to under the tokenizer: a small JSON file
   (:class:`TokenCounts`), O(units), never O(documents).
2. :class:`TextLoader` cuts the epoch's token stream into equal shares per rank from those
   counts (``plan::packed`` in the Rust core): every rank yields the same number of full rows,
   every token of every document is in exactly one row per epoch (except the remainder,
   shorter than one global batch, reported in ``stats``), and ``state_dict`` /
   ``load_state_dict`` continue at the exact next token, also onto another world size.

Documents are concatenated, each followed by the EOS (and preceded by a BOS when named), and cut
into rows, as Megatron and LitData pack; a document longer than a row spans rows. With
``boundaries=True`` each batch also carries ``position_ids`` restarting at every document and
``cu_seqlens`` for FlashAttention's varlen kernels, so attention need never cross documents.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from shardstream import _core
from shardstream._system import default_loader_threads
from shardstream.config import SourceOptions
from shardstream.errors import OptionError, from_core_fault

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the bare-wheel smoke test
    torch = None  # type: ignore[assignment]

COUNTS_FORMAT = "shardstream-token-counts"
COUNTS_VERSION = 1
STATE_FORMAT = "shardstream-packed-state"
STATE_VERSION = 1
#: Documents larger than this many bytes are skipped (``member_too_large``), never loaded whole.
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20


@dataclass(frozen=True)
class TokenCounts:
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
            counted), ``documents``, ``tokens``, ``skipped`` (reason to count).
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

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole corpus (every document, with its EOS/BOS)."""
        return sum(int(u["tokens"]) for u in self.units)

    @property
    def documents(self) -> int:
        """Documents that encode to tokens (skipped ones not counted)."""
        return sum(int(u["documents"]) for u in self.units)

    @property
    def skipped(self) -> dict[str, int]:
        """Documents skipped while counting, by reason (``bad_utf8``, ``missing_text``, ...)."""
        total: Counter[str] = Counter()
        for u in self.units:
            total.update(u.get("skipped", {}))
        return dict(total)

    def identity(self) -> str:
        """A short hash of the counts and their tokenizer: a resume state made over other counts
        is refused."""
        digest = hashlib.sha256(self.fingerprint.encode())
        for u in self.units:
            digest.update(f"{u['url']}|{u['first_row']}|{u['tokens']}\n".encode())
        return digest.hexdigest()[:16]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the counts as JSON, atomically.

        Args:
            path: Where; gzip-compressed when it ends in ``.gz``.
        """
        data = json.dumps({"format": COUNTS_FORMAT, "version": COUNTS_VERSION, **self.__dict__}).encode()
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(gzip.compress(data) if path.endswith(".gz") else data)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenCounts:
        """Reads counts written by :meth:`save`.

        Args:
            path: A file :meth:`save` wrote (plain or gzip JSON).

        Returns:
            The counts.

        Raises:
            ValueError: the file is not a token counts file of a version this package reads.
        """
        path = os.fspath(path)
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{path}: not a token counts file ({e})") from None
        if not isinstance(data, dict) or data.get("format") != COUNTS_FORMAT:
            raise ValueError(f"{path}: not a token counts file (no format {COUNTS_FORMAT!r})")
        if data.get("version") != COUNTS_VERSION:
            raise ValueError(f"{path}: token counts version {data.get('version')}, this package reads 1")
        data.pop("format")
        data.pop("version")
        return cls(**data)


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
        threads: Threads reading and tokenizing (default: this process's share of the cores).
        output: If given, the counts are also saved there (see :meth:`TokenCounts.save`).
        source: How the files are fetched (S3 endpoint, cache, ...).

    Returns:
        The counts.

    Raises:
        ValueError: the tokenizer file does not load, ``text_key`` is empty, no file matches, or
            no unit holds a single token (every file failed, or every document was skipped): the
            message names the most common reason.
    """
    from shardstream.urls import TEXT_SUFFIXES, expand_urls, source_config

    if max_document_bytes <= 0:
        raise OptionError("max_document_bytes", f"must be positive, not {max_document_bytes}")
    options = (source or SourceOptions()).keywords()
    shards = expand_urls(urls, suffixes=TEXT_SUFFIXES, **options)
    if not shards:
        raise ValueError(f"no files match {urls!r}")
    config = source_config(shards, options)
    tokenizer = os.path.abspath(os.fspath(tokenizer))
    fingerprint, _, _ = _core.packed_encoder(tokenizer, eos_token, bos_token)
    results = _core.count_tokens(
        [s.url for s in shards],
        tokenizer,
        text_key,
        eos_token,
        bos_token,
        max_document_bytes,
        threads or default_loader_threads(),
        config,
    )
    display = {s.url: s.display for s in shards}
    units: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for r in results:
        r["display"] = display.get(r["url"], r["url"])
        error = r.pop("error")
        examples = r.pop("examples")
        if error is not None:
            failed.append({"url": r["url"], "display": r["display"], "error": error})
        else:
            r["examples"] = examples[:3]
            units.append(r)
    counts = TokenCounts(
        tokenizer, fingerprint, text_key, eos_token, bos_token, max_document_bytes, units, failed
    )
    if counts.total_tokens == 0:
        what = (
            repr(urls) if isinstance(urls, (str, os.PathLike)) or len(shards) == 1 else f"{len(shards)} files"
        )
        raise ValueError(f"no document of {what} encodes to a token: {_top_reason(counts)}")
    if output is not None:
        counts.save(output)
    return counts


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


class TextLoader:
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
    """

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
        self.counts = counts if isinstance(counts, TokenCounts) else TokenCounts.load(counts)
        c = self.counts
        if not os.path.isfile(c.tokenizer):
            raise ValueError(f"the token counts' tokenizer file {c.tokenizer!r} does not exist")
        fingerprint, _, _ = _core.packed_encoder(c.tokenizer, c.eos_token, c.bos_token)
        if fingerprint != c.fingerprint:
            raise ValueError(
                f"the tokenizer file {c.tokenizer!r} changed since the tokens were counted "
                f"(fingerprint {fingerprint}, counted with {c.fingerprint}): count again"
            )
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.block_rows, self.boundaries, self.dtype = block_rows, boundaries, dtype
        self.threads = threads or default_loader_threads()
        self.prefetch = max(1, prefetch)
        self._rank_arg, self._world_arg = rank, world_size
        self._pin = (
            pin_memory if pin_memory is not None else bool(torch is not None and torch.cuda.is_available())
        )
        options = (source or SourceOptions()).keywords()
        self._config = self._core_config(options)
        self._units = [(u["url"], int(u["first_row"]), u["rows"], u["identity"]) for u in c.units]
        self._tokens = [int(u["tokens"]) for u in c.units]
        self._total = sum(self._tokens)  # len() is called often by frameworks: summed once
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        self._batches_done = 0
        self._pass_completed = False
        self._last_stats: dict[str, Any] = {}
        # DataLoader worker processes reading this rank's share (0: read in this process).
        self._num_workers = 0
        if len(self) == 0 and self._resume is None:
            need = self.world_size * batch_size * seq_len
            raise ValueError(
                f"the corpus holds {c.total_tokens} tokens, less than one global batch "
                f"({self.world_size} ranks x {batch_size} rows x {seq_len} tokens = {need})"
            )

    def _core_config(self, options: dict[str, Any]) -> dict[str, Any]:
        from shardstream.urls import expand_urls, source_config

        c = self.counts
        # Only signed sources need their URLs re-expanded (for the S3 or Hub signer, and the CA
        # bundle): local and http(s) files open as they are, so 100k local files cost nothing here.
        signed = sorted({u["url"] for u in c.units if u["url"].startswith(("s3://", "hf://"))})
        shards = expand_urls(signed, **{**options, "check": "none"}) if signed else []
        config = source_config(shards, options)
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
    @property
    def rank(self) -> int:
        """This process's rank (see the ``rank`` argument)."""
        from shardstream.loader import distributed_rank_world

        return distributed_rank_world(self._rank_arg, self._world_arg)[0]

    @property
    def world_size(self) -> int:
        """The number of ranks (see the ``world_size`` argument)."""
        from shardstream.loader import distributed_rank_world

        return distributed_rank_world(self._rank_arg, self._world_arg)[1]

    def _shape(self) -> tuple[int, int, int, int, int]:
        return (self.world_size, self._num_workers, self.batch_size, self.seq_len, self.block_rows)

    def _phases(self) -> list[tuple[tuple[int, int, int, int, int], int]]:
        """The resume state's phases (empty for a fresh epoch)."""
        if self._resume is None:
            return []
        return [(tuple(p["shape"]), int(p["batches_done"])) for p in self._resume["phases"]]  # type: ignore[misc]

    def _plan_counts(self) -> tuple[int, int, int]:
        return _core.packed_plan_counts(self._total, self.seed, self.epoch, self._phases(), self._shape())

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (after a resume: those left)."""
        return self._plan_counts()[0]

    @property
    def batches_per_epoch(self) -> int:
        """The steps of this epoch as a framework counts them (``len()`` counts what is left
        after a resume): the batches per rank done before the loaded position, in every phase
        (at the world sizes they were done at), plus those left."""
        done = sum(batches for _, batches in self._phases()) if self._resume is not None else 0
        return done + len(self)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its beginning; except right after :meth:`load_state_dict` of
        a state in that same epoch, whose position is kept (frameworks restore the loader, then
        set the epoch they resume in).

        Args:
            epoch: The epoch to read next (it seeds the order of units and rows).
        """
        epoch = int(epoch)
        if self._resume is not None and self._batches_done == 0 and int(self._resume["epoch"]) == epoch:
            return
        self.epoch = epoch
        self._resume = None
        self._batches_done = 0

    # -- iteration ------------------------------------------------------------------------
    def _alloc(self) -> tuple[Any, Any]:
        shape = (self.batch_size, self.seq_len)
        if torch is not None:
            dtype = torch.int32 if self.dtype == "int32" else torch.int64
            # A DataLoader worker (a forked process) must not touch CUDA: the DataLoader pins.
            pin = self._pin and torch.utils.data.get_worker_info() is None
            ids = torch.empty(shape, dtype=dtype, pin_memory=pin)
            pos = torch.empty(shape, dtype=torch.int64, pin_memory=pin) if self.boundaries else None
        else:
            ids = np.empty(shape, dtype=np.int32 if self.dtype == "int32" else np.int64)
            pos = np.empty(shape, dtype=np.int64) if self.boundaries else None
        return ids, pos

    @staticmethod
    def _address(buf: Any) -> tuple[int, int]:
        if torch is not None and isinstance(buf, torch.Tensor):
            return buf.data_ptr(), buf.numel() * buf.element_size()
        return buf.ctypes.data, buf.nbytes

    def _lend(self, core: Any) -> tuple[Any, Any]:
        ids, pos = self._alloc()
        ptr, nbytes = self._address(ids)
        if pos is None:
            core.submit(ids, ptr, nbytes)
        else:
            pos_ptr, pos_bytes = self._address(pos)
            core.submit((ids, pos), ptr, nbytes, pos_ptr, pos_bytes // 8)
        return ids, pos

    def __iter__(self) -> Iterator[TextBatch]:
        self._begin_pass()
        return self._iterate()

    # What a pass through DataLoader workers (_CountingLoader, _WorkerView) calls; TextMixture
    # has the same five, so both kinds share that machinery.
    def _begin_pass(self) -> None:
        if self._pass_completed and self._resume is not None:
            # A pass after one that read a resumed epoch to its end reads the epoch whole.
            self._resume = None
        self._pass_completed = False
        self._batches_done = 0

    def _end_pass(self) -> None:
        self._pass_completed = True

    def _set_workers(self, num_workers: int) -> None:
        self._num_workers = num_workers

    def _worker_batches(self) -> Iterator[tuple[TextBatch, dict[str, Any]]]:
        """In a DataLoader worker: its reader's batches, each with its counters (faults left
        out: they stay bounded in the worker)."""
        for batch in self._iterate():
            yield batch, {k: v for k, v in self._last_stats.items() if k != "faults"}

    def _merge_worker_stats(self, per_worker: list[dict[str, Any]]) -> None:
        from shardstream.loader import merge_stats

        self._last_stats = merge_stats(per_worker)

    def _iterate(self) -> Iterator[TextBatch]:
        worker_info = torch.utils.data.get_worker_info() if torch is not None else None
        worker = 0 if worker_info is None else worker_info.id
        core = _core.PackedLoader(
            self._units,
            self._tokens,
            self.seed,
            self.epoch,
            self._phases(),
            self._shape(),
            self.rank,
            worker,
            dict(self._config, threads=self.threads),
        )
        lent: deque[tuple[Any, Any]] = deque()
        try:
            for _ in range(self.prefetch):
                lent.append(self._lend(core))
            while True:
                try:
                    result = core.next_batch()
                except _core.CoreFault as fault:
                    raise from_core_fault(fault) from None
                if result is None:
                    self._pass_completed = True
                    break
                _, cu_seqlens, max_seqlen = result
                ids, pos = lent.popleft()
                self._batches_done += 1
                if worker_info is not None:  # the main process reads a worker's stats per batch
                    self._last_stats = core.stats()
                if self.boundaries:
                    cu = (
                        torch.tensor(cu_seqlens, dtype=torch.int32)
                        if torch is not None
                        else np.asarray(cu_seqlens, dtype=np.int32)
                    )
                    yield TextBatch(ids, pos, cu, int(max_seqlen))
                else:
                    yield TextBatch(ids)
                lent.append(self._lend(core))
        finally:
            try:
                self._last_stats = core.stats()
            except ImportError:  # the interpreter is shutting down with this iterator open
                pass
            core.close()

    def dataloader(self, num_workers: int, **kwargs: Any) -> Any:
        """A torch DataLoader in which ``num_workers`` worker processes read this rank's share,
        each a contiguous part of it (``plan::packed``'s readers), yielded in torch's round-robin
        order; the iterable it returns keeps the batch count that ``state_dict()`` needs and the
        workers' stats. Each worker tokenizes on ``threads`` threads of its own.

        Args:
            num_workers: Worker processes (at least 1).
            **kwargs: Passed to ``torch.utils.data.DataLoader`` (``pin_memory`` defaults to the
                loader's); ``batch_size``, ``collate_fn``, ``sampler`` and
                ``persistent_workers=True`` are refused (workers read the epoch and the resume
                position when they start).

        Returns:
            An iterable with ``len()``, ``set_epoch``, ``state_dict`` and ``load_state_dict``.

        Raises:
            OptionError: ``num_workers`` is below 1.
            TypeError: a refused keyword.
        """
        return workers_dataloader(self, num_workers, kwargs, pin=self._pin)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the last (or current) pass of this rank: ``batches``, ``rows``,
        ``tokens`` (written into rows), ``documents`` (begun in rows), ``skipped`` documents by
        reason, ``bytes``, ``retries``, ``tokenize_seconds``; and for the epoch:
        ``remainder_tokens`` (read by no rank) and ``exact`` (True)."""
        stats = dict(self._last_stats)
        stats["remainder_tokens"] = self._plan_counts()[2]
        stats["exact"] = True
        return stats

    # -- resume --------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        """The position after the batches yielded so far (or ``batches``): small,
        JSON-serialisable and the same on every rank (every rank yields the same batches), so
        rank 0 can save it. ``gather`` is accepted for the framework adapters and does nothing:
        a packed epoch has no per-rank reserve to collect.

        Args:
            batches: The batches consumed so far; default: those this loader yielded.
            gather: Ignored (see above).

        Returns:
            The state, for :meth:`load_state_dict`.
        """
        del gather
        done = self._batches_done if batches is None else int(batches)
        phases = [dict(p) for p in self._resume["phases"]] if self._resume is not None else []
        shape = list(self._shape())
        if phases and list(phases[-1]["shape"]) == shape:
            phases[-1]["batches_done"] = int(phases[-1]["batches_done"]) + done
        else:
            phases.append({"shape": shape, "batches_done": done})
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "counts": self.counts.identity(),
            "seed": self.seed,
            "epoch": self.epoch,
            "phases": phases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues the epoch of ``state`` at the exact next token; with another world size,
        batch size, row length or block size, the rest of the epoch is re-planned so that every
        token left is read exactly once.

        Args:
            state: What :meth:`state_dict` returned (on any rank).

        Raises:
            ValueError: the state is not a text loader's, or was saved over other token counts
                or another seed.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a TextLoader state (no format 'shardstream-packed-state')")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"TextLoader state version {state.get('version')}, this package reads 1")
        if state["counts"] != self.counts.identity():
            raise ValueError("this state was saved over other token counts (another corpus or tokenizer)")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"this state was saved with seed {state['seed']}, the loader has {self.seed}")
        self.epoch = int(state["epoch"])
        self._resume = {"epoch": self.epoch, "phases": [dict(p) for p in state["phases"]]}
        self._batches_done = 0
        self._pass_completed = False
        self._plan_counts()  # a state that does not fit the counts fails here, not mid-pass


def workers_dataloader(owner: Any, num_workers: int, kwargs: dict[str, Any], *, pin: bool) -> Any:
    """``owner.dataloader(num_workers, **kwargs)`` of a packed kind (TextLoader, TextMixture):
    checks the arguments, lays the owner's plan out for the workers and wraps the DataLoader."""
    name = type(owner).__name__
    if torch is None:
        raise RuntimeError(f"{name}.dataloader needs torch")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise OptionError("num_workers", f"must be at least 1, not {num_workers!r}")
    for refused in ("batch_size", "collate_fn", "sampler", "batch_sampler"):
        if refused in kwargs:
            raise TypeError(f"{name}.dataloader() takes no {refused}: the loader makes the batches")
    if kwargs.get("persistent_workers"):
        raise TypeError(f"{name}.dataloader() takes no persistent_workers=True: workers start per pass")
    owner._set_workers(num_workers)
    kwargs.setdefault("pin_memory", pin)
    inner = torch.utils.data.DataLoader(
        _WorkerView(owner), batch_size=None, num_workers=num_workers, **kwargs
    )
    return _CountingLoader(owner, inner)


class _CountingLoader:
    """A DataLoader over a packed kind's worker view: counts the batches it yields for
    ``state_dict`` and merges the workers' counters (each sends its own with every batch)."""

    def __init__(self, owner: Any, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    def __len__(self) -> int:
        return len(self.owner)

    @property
    def batches_per_epoch(self) -> int:
        return self.owner.batches_per_epoch

    @property
    def epoch(self) -> int:
        return self.owner.epoch

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)

    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        return self.owner.state_dict(batches, gather=gather)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.owner.load_state_dict(state)

    @property
    def stats(self) -> dict[str, Any]:
        return self.owner.stats

    def __iter__(self) -> Iterator[TextBatch]:
        owner = self.owner
        owner._begin_pass()
        per_worker: dict[int, Any] = {}
        for batch, worker, stats in self.inner:
            owner._batches_done += 1
            per_worker[worker] = stats
            owner._merge_worker_stats(list(per_worker.values()))
            yield batch
        owner._end_pass()


if torch is not None:

    class _WorkerView(torch.utils.data.IterableDataset):
        """What each DataLoader worker iterates: the owner's batches for that worker, each with
        the worker's id and counters."""

        def __init__(self, owner: Any) -> None:
            self.owner = owner

        def __iter__(self) -> Iterator[tuple[TextBatch, int, Any]]:
            worker = torch.utils.data.get_worker_info()
            wid = 0 if worker is None else worker.id
            for batch, counters in self.owner._worker_batches():
                yield batch, wid, counters
