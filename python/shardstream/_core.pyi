"""Type stubs for ``shardstream._core``, the Rust extension (rust/src/binding/).

Private module: the public API is ``shardstream`` itself. These stubs describe exactly what the
extension exports; ``tests/test_wheel.py::test_stubs_match_extension`` fails when a name is added
to or removed from the extension (or one of its classes) without updating this file.

Defaults written ``= ...`` are the core's: they are defined once, in rust/src/defaults.rs, and
readable as :data:`DEFAULTS` (typed in ``shardstream.config.DEFAULTS``).
"""

from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict, final

__version__: str

# rust/src/defaults.rs by option name, durations in seconds; its keys and types are those of
# shardstream.config.CoreDefaults, the typed view the package reads.
DEFAULTS: dict[str, Any]

OnError = Literal["skip", "raise"]

# (url, shard, start_offset, first_ordinal, skip_before, end_ordinal, stride): one run of
# consecutive samples of one shard that a reader reads. ``stride`` = (step, offset) keeps every
# step-th sample starting at offset (streaming without an index); None keeps every sample.
SpanTuple = tuple[str, int, int, int, int, int | None, tuple[int, int] | None]

class UnknownSetting(ValueError):
    """A config key the core does not read: ``args = (key, kind, message)``. A setting misspelt or
    meant for another kind is refused by name, never ignored with its default taken."""

class MissingSetting(ValueError):
    """A config key the core needs that is absent or None: ``args = (key, kind, message)``."""

class WrongSetting(TypeError):
    """A config value the core cannot read as its setting's type, or out of its range (a
    negative count): ``args = (key, kind, message)``."""

class FfmpegUnavailable(ImportError):
    """No usable FFmpeg shared libraries in this process (none found, or a release this build
    has no layout for): video cannot be decoded. ``args = (message,)``."""

class CoreFault(Exception):
    """A shard or sample fault: ``args = (reason, url, key, detail, kind)``.

    ``reason`` is a snake_case reason name (``truncated_tar``, ``corrupt_image``, ...); ``url`` is
    already redacted; ``key`` is empty for shard-level faults; ``kind`` says what kind of source
    failure an ``unreadable`` shard was (``not_found``, ``credentials``, ``bad_url``, ``other``).
    ``shardstream.errors`` turns it into the public ``ShardError`` hierarchy by ``kind``.
    """

    args: tuple[str, str, str, str, str]

class InvalidSample(TypedDict):
    ordinal: int
    key: str
    reason: str
    detail: str

class ShardFatal(TypedDict):
    reason: str
    kind: str  # the source failure of an unreadable shard: not_found, credentials, bad_url, other
    detail: str

class ScanReport(TypedDict):
    """What ``scan_shard`` returns (``scan::ShardReport``)."""

    url: str  # redacted
    bytes: int  # bytes read from the source (compressed size for gzip shards)
    samples: int
    offsets: list[int]  # byte offset of each sample's first header, then the end of the last one
    keys: list[str]
    invalid: list[InvalidSample]
    fatal: ShardFatal | None
    compressed: bool
    captured: NotRequired[list[str | None]]  # with capture=: that member of each sample, as text

class ReaderPlan(TypedDict):
    """What ``EpochPlanView.reader`` returns: the spans and shuffle of one (rank, worker)."""

    spans: PlannedSpans
    num_batches: int
    last_batch_size: int | None
    block_size: int
    shuffle_seed: int
    first_block: int
    skip_emitted: int
    reader: int  # the phase reader this (rank, worker) plays (resume shifts DataLoader workers)

@final
class SampleIter:
    """Raw samples of a list of shards, grouped as webdataset groups them.

    Yields dicts with ``__key__``, ``__url__`` (the display URL) and one ``bytes`` value per member
    extension. ``config`` may hold ``connect_timeout``, ``read_timeout``, ``backoff_initial``,
    ``backoff_max``, ``retry_after_max`` (seconds), ``max_retries``, and ``signer`` (a callable
    presigning an ``s3://`` URL, or resolving an ``hf://`` one, when it is opened; it returns a
    URL, or ``(url, [(header, value), ...])`` for headers such as a token).
    """

    def __new__(
        cls,
        urls: Sequence[str],
        display_urls: Sequence[str],
        on_error: OnError = ...,
        max_member_bytes: int = ...,
        config: dict[str, Any] | None = None,
    ) -> SampleIter: ...
    def __iter__(self) -> SampleIter: ...
    def __next__(self) -> dict[str, Any]: ...
    @property
    def skipped(self) -> int:
        """Samples skipped (with ``on_error="skip"``) so far."""

@final
class Pipeline:
    """The running pipeline of one reader, of any kind (started by :func:`sample_pipeline`,
    :func:`packed_pipeline` or :func:`budget_pipeline`).

    Python lends buffers (``submit``) and takes back finished batches (``next_batch``) in the
    same order; every wait releases the GIL."""

    @property
    def region_bytes(self) -> list[int]:
        """Bytes each region of a lent buffer must hold, in ``submit``'s order (0: not used in
        this configuration). Sample kinds: pixels, int64 tokens. Packed text: ids, int64
        positions. Token budget: patches, int64 tokens."""
    @property
    def batches_left(self) -> int | None:
        """Batches this reader yields from its position on, when its plan knows (else None)."""
    def submit(self, owner: object, regions: Sequence[tuple[int, int]]) -> bool:
        """Lends one batch's buffer: ``regions`` are (address, bytes) pairs in ``region_bytes``'
        order ((0, 0) for a region not used), inside ``owner`` (the tensors or arrays holding
        that memory; the pipeline keeps a reference while it may write there). Raises
        ``ValueError`` naming a region too small for a batch; False once the pipeline ended."""
    def next_batch(self) -> tuple[Any, ...] | None:
        """The next batch's metadata, or None at the end of the pass. Sample kinds: (n, keys,
        texts, shard_urls, reserve_used, grids), where ``reserve_used`` counts the reserve
        positions this reader consumed up to it and ``grids`` is the NaFlex kind's patch grid
        (rows, columns) per sample, None for square images. Packed text: (rows, cu_seqlens,
        max_seqlen). Token budget: (images, length, grids, texts, keys, urls).

        Raises ``CoreFault`` when the pass fails (``on_error="raise"``, a unit that cannot be
        read or no longer matches its counts, a panic)."""
    def stats(self) -> dict[str, Any]:
        """What the pipeline counted. Sample kinds: samples, batches, bytes, retries, throttled,
        resumes, decode_seconds, skipped (by reason), skipped_total, shard_errors, replaced,
        padded, remainder, remainder_keys, faults. Packed text: batches, rows, tokens,
        documents, bytes, retries, throttled, resumes, tokenize_seconds, skipped, skipped_total,
        faults. Token budget: batches, images, patches, slots, decode_seconds, bytes, retries,
        skipped."""
    def close(self) -> None:
        """Stops every thread; afterwards no lent buffer is written any more."""

def sample_pipeline(
    spans_list: PlannedSpans | Sequence[SpanTuple],
    config: dict[str, Any],
    display_urls: Sequence[str] = ...,
) -> Pipeline:
    """Starts the pipeline of one reader of the sample kinds (square images; NaFlex at a fixed
    count). ``spans_list``: a planned reader's spans (``EpochPlanView.reader(...)["spans"]``), or
    streaming span tuples whose shard numbers index ``display_urls``.

    Config keys (kind "loader"): ``batch_size``, ``block_size``, ``crop_seed``, ``cycle``,
    ``drop_last``, ``first_block``, ``last_batch_size``, ``max_member_bytes``, ``naflex``,
    ``num_batches``, ``on_error``, ``planned``, ``read_ahead``, ``shuffle_seed``,
    ``skip_emitted``, ``sources``, ``span_queue``, ``threads``, ``tokenizer``, ``undecoded``;
    and the source options and the sample options.
    ``tokenizer`` is a dict of kind "caption tokenizer" (``kind``: "bpe" or "json", ``path``,
    ``context_length``; ``shardstream.tokenizer.core_tokenizer``) or None.
    ``crop`` is ``"center"``/``"random"``; ``naflex`` is a dict of kind "NaFlex spec"
    (patch_size, max_num_patches, min_num_patches, random_crop: (scale, ratio) or None): the
    NaFlex kind, ``[B, max_num_patches, 3 * patch_size ** 2]`` buffers. A key that is absent
    or None keeps the core's default (rust/src/defaults.rs);
    ``shardstream.config.LoaderConfig.core_config`` is the typed definition of most of them.
    ``UnknownSetting`` for a key it does not read."""

@final
class MixturePlan:
    """Several indexes planned as one epoch, each source taking its share (rust/src/plan/mixture.rs)."""

    def __new__(
        cls,
        sources: Sequence[DatasetIndex],
        shares: Sequence[tuple[str, float]],
        epoch_samples: int | None = None,
    ) -> MixturePlan:
        """``shares[i]``: ("weight", w) or ("samples", n) for ``sources[i]``."""
    @property
    def quotas(self) -> list[int]:
        """Samples per epoch of each source."""
    @property
    def first_shards(self) -> list[int]:
        """Each source's first shard in the mixture's numbering."""
    @property
    def num_samples(self) -> int: ...
    @property
    def fingerprint(self) -> int: ...
    def plan(self, request: PlanRequest) -> EpochPlanView:
        """As ``DatasetIndex.plan``, over the mixture."""

class DatasetIndex:
    """A dataset index (rust/src/index/ defines both layouts). Pickles as its bytes and location."""

    @staticmethod
    def from_bytes(data: bytes, location: str | None = None) -> DatasetIndex:
        """Parses a version-2 manifest (detail files are looked up beside ``location``) or
        version-1 JSON (plain or gzip)."""
    @staticmethod
    def from_layout(manifest: bytes, detail: bytes) -> DatasetIndex:
        """An in-memory index from its ``to_layout`` bytes (how a subset pickles)."""
    @staticmethod
    def from_json(data: bytes) -> DatasetIndex:
        """Parses a version-1 index document (JSON, optionally gzip-compressed)."""
    @staticmethod
    def from_scan_reports(reports_json: str, urls: Sequence[str], with_keys: bool = True) -> DatasetIndex:
        """Builds an index from ``scan_shard`` reports (a JSON list) and the URLs users name them by."""
    @staticmethod
    def from_img2dataset_stats(entries: Sequence[tuple[str, bytes]]) -> DatasetIndex:
        """An index from (shard URL, img2dataset ``NNNNN_stats.json`` bytes): counts, no offsets."""
    @staticmethod
    def img2dataset_stats_url(shard_url: str) -> str | None:
        """Where img2dataset writes a shard's stats (``00001.tar`` -> ``00001_stats.json``)."""
    def to_json(self) -> bytes: ...
    def to_layout(self, detail_file: str) -> tuple[bytes, bytes]:
        """(manifest, detail file) of the version-2 layout; the manifest names the detail file
        ``detail_file``."""
    def with_shard_names(self, urls: Sequence[str], displays: Sequence[str]) -> DatasetIndex:
        """The same index, opening shard i at ``urls[i]`` and naming it ``displays[i]``."""
    def with_selections(
        self, selections: Sequence[Sequence[int]], config: dict[str, Any] | None = None
    ) -> DatasetIndex:
        """The subset keeping ordinals ``selections[i]`` (valid samples) of shard i, with its
        per-sample detail read into memory so that it can be written with its own."""
    def shard_samples(
        self, shard: int, config: dict[str, Any] | None = None
    ) -> tuple[list[int], list[str] | None]:
        """(ordinals the plan schedules, keys or None) of one shard."""
    @property
    def is_subset(self) -> bool:
        """Whether the shards keep only selected samples (``shardstream subset``)."""
    @staticmethod
    def assemble(parts: Sequence[tuple[DatasetIndex, int]], location: str | None = None) -> DatasetIndex:
        """Shard i is shard ``parts[i][1]`` of index ``parts[i][0]``: how an index is updated."""
    def shard_identities(self) -> list[tuple[str, int | None, str | None]]:
        """Per shard (URL, size, identity) as the index recorded them."""
    @property
    def location(self) -> str | None: ...
    @property
    def has_detail_files(self) -> bool: ...
    def url(self, i: int) -> str: ...
    def schemes(self) -> list[str]:
        """Distinct URL schemes of the shards (``local`` for plain paths)."""
    @property
    def urls(self) -> list[str]: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def num_valid(self) -> int: ...
    @property
    def fingerprint(self) -> int: ...
    def __len__(self) -> int: ...
    def plan(self, request: PlanRequest) -> EpochPlanView:
        """The epoch plan ``request`` asks for."""

@final
class PlanRequest:
    """What ``DatasetIndex.plan`` and ``MixturePlan.plan`` are asked for: the phase's settings,
    and where the epoch starts."""

    def __new__(
        cls,
        *,
        seed: int,
        epoch: int,
        world_size: int,
        workers: int,
        batch_size: int,
        block_size: int,
        drop_last: bool,
        state: str | None = None,
    ) -> PlanRequest:
        """A fresh epoch ``epoch`` of ``seed``; with ``state`` (a ``state_dict`` JSON), the rest of
        the epoch it describes, re-planned onto these settings if they differ."""

@final
class EpochPlanView:
    """One epoch's plan over an index: what each reader reads, and the resumable state."""

    @property
    def num_batches(self) -> int:
        """Batches per rank from here on (the same on every rank)."""
    @property
    def remainder_len(self) -> int: ...
    def remainder_keys(self, config: dict[str, Any] | None = None) -> list[str]:
        """Keys of the samples left out of this epoch, when the index holds keys (in memory, or
        in the detail blocks of the shards holding them, fetched with the reader ``config``)."""
    def reader(self, rank: int, worker: int) -> ReaderPlan:
        """What reader (rank, worker) reads: ``spans`` (a :class:`PlannedSpans`) and its shuffle."""
    def state(self, batches: int, reserve_used: Sequence[tuple[int, int, int]] = ...) -> str:
        """The resumable state (JSON) after ``batches`` batches were consumed on every rank and
        readers used ``reserve_used`` = (rank, phase reader, positions) of their reserve."""

@final
class PlannedSpans:
    """The spans and reserve spans of one planned reader, built in Rust for :func:`sample_pipeline`."""

def scan_shard(
    url: str,
    *,
    decode: bool = True,
    caption_key: str = ...,
    image_keys: Sequence[str] | None = None,
    require_caption: bool = True,
    max_pixels: int = ...,
    max_member_bytes: int = ...,
    image_size: int = ...,
    config: dict[str, Any] | None = None,
    capture: str | None = None,
) -> ScanReport:
    """Validates one shard (structure, grouping, and with ``decode`` the loader's decode path);
    ``config`` holds reader options and the ``signer`` of an ``s3://`` shard; ``capture`` (a
    member extension such as ``json``) returns that member of every sample as text.

    Config keys (kind "source"): the source options (other keys are left to the caller)."""

def probe_image(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) from an image's header, without decoding pixels.

    Raises ``ValueError`` when the header is not a supported image."""

def decode_image(
    data: bytes,
    size: int = ...,
    max_pixels: int = ...,
    *,
    crop: Literal["center", "random"] = ...,
    random_crop_scale: tuple[float, float] = ...,
    random_crop_ratio: tuple[float, float] = ...,
    crop_seed: int = 0,
    whole: bool = False,
) -> bytes:
    """Decodes one image exactly as the loader does: ``3 * size * size`` uint8 bytes, CHW.

    ``crop``, ``random_crop_scale``, ``random_crop_ratio`` and ``crop_seed`` as in the loader's
    config (the crop's randomness also depends on the sample key, here ``"image"``); ``whole``
    decodes every row and block of the image, as validation does, instead of only what the crop's
    resize reads."""

def redact_url(url: str) -> str:
    """The URL with credentials and query string (presigned signatures) removed."""

def derive_seed(parts: Sequence[int]) -> int:
    """The seed derivation used everywhere in the crate (each part a uint64)."""

def assign_shards(
    num_shards: int,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    workers: int,
    batch_size: int,
    block_size: int,
    samples_per_epoch: int,
    rank: int,
    worker: int,
) -> tuple[list[int], tuple[int, int], int, int]:
    """One reader's shards without an index: (shard ids in reading order, (stride, offset),
    batches, shuffle base seed)."""

class ClipTokenizer:
    """The Rust CLIP tokenizer (open_clip's SimpleTokenizer, token for token but for ftfy)."""

    def __new__(cls, kind: str, path: str, context_length: int) -> ClipTokenizer: ...
    @property
    def context_length(self) -> int: ...
    @property
    def pad_id(self) -> int:
        """The id rows are padded with: 0 for open_clip's BPE, a tokenizer.json's own pad id."""
    @staticmethod
    def clean(text: str) -> str: ...
    def tokenize_into(self, texts: list[str], ptr: int, len: int) -> None: ...

# -- the packed text kind (rust/src/binding/packed.rs) ---------------------------------------------

#: (world_size, workers, batch_size, seq_len, block_rows) of a packed plan's phase.
StreamShape = tuple[int, int, int, int, int]
#: (the stream's planned end, whether phases after the first are padded): the end is the units'
#: total weight, or less where a mixture's epoch ends first; a padded phase reads every position
#: left, the ranks short of a batch getting padding.
PlanEnd = tuple[int, bool]
#: (seed, epoch, earlier phases with their batches done, current shape, rank, worker, end): one
#: reader of one epoch's plan over unit weights.
PlanReader = tuple[int, int, Sequence[tuple[StreamShape, int]], StreamShape, int, int, PlanEnd]

def packed_encoder(
    tokenizer: str, eos_token: str | None = None, bos_token: str | None = None
) -> tuple[str, int, int | None]:
    """(fingerprint, eos id, bos id or None) of a tokenizer.json under these settings; raises
    ``ValueError`` naming the file when it does not load or lacks the token."""

def packed_fast_path(
    tokenizer: str, eos_token: str | None = None, bos_token: str | None = None
) -> tuple[bool, str]:
    """(True, "") when the loader encodes with its fast byte-level BPE path, else (False, the
    reason the file is outside it: the tokenizers library encodes)."""

def packed_encode(
    tokenizer: str, texts: list[str], eos_token: str | None = None, bos_token: str | None = None
) -> list[list[int]]:
    """Each text's ids as the loader encodes documents: BOS (if any), the ids, EOS."""

def count_tokens(
    urls: list[str],
    tokenizer: str,
    text_key: str,
    eos_token: str | None = None,
    bos_token: str | None = None,
    max_document_bytes: int = ...,
    threads: int = 1,
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Per unit (Parquet row group, JSONL file or tar shard), in file order: url, first_row, rows,
    identity, documents, tokens, skipped (by reason), examples (skipped documents), error (None,
    or the fault that made the unit unreadable).

    Config keys (kind "token count"): the source options."""

def packed_plan_counts(
    end: PlanEnd, seed: int, epoch: int, phases: Sequence[tuple[StreamShape, int]], current: StreamShape
) -> tuple[int, int, int, int]:
    """(batches per rank left from the recorded position, the current phase's batches per rank,
    positions of the remainder, positions of padding) of an epoch's packed plan up to ``end``."""

def packed_pipeline(
    units: Sequence[tuple[str, int, int | None, str | None]],
    counts: Sequence[int],
    reader: PlanReader,
    config: dict[str, Any],
) -> Pipeline:
    """Starts the packed text pipeline of one ``reader``. Its batches fail with ``CoreFault``
    naming the unit when it cannot be read or its tokens differ from the counts.

    Config keys (kind "packed text"): ``bos_token``, ``boundaries``, ``eos_token``, ``int32``,
    ``max_document_bytes``, ``text_key``, ``threads``, ``tokenizer``; and the source options.
    ``tokenizer`` is required (``MissingSetting`` without it)."""

def count_patches(urls: list[str], config: dict[str, Any], threads: int = 1) -> list[dict[str, Any]]:
    """Per unit (tar shard or Parquet row group), in file order, under the NaFlex grid rule and a
    patch budget: url, first_row, rows, identity, samples, batches, patches, slots, fixed_slots,
    skipped (by reason), examples, error.

    Config keys (kind "token-budget NaFlex"): ``buckets``, ``crop_seed``,
    ``max_images_per_batch``, ``max_member_bytes``, ``max_patches_per_batch``, ``naflex``,
    ``threads``, ``tokenizer``; and the source options and the sample options.
    ``naflex``, ``max_patches_per_batch`` and ``buckets`` are required; the pipeline's
    ``threads``, ``crop_seed`` and ``tokenizer`` are read by :func:`budget_pipeline` only."""

def interleaved_tokens(config: dict[str, Any]) -> tuple[str, int, tuple[int, int, int], int | None]:
    """(the tokenizer file's fingerprint, its EOS id, the (vision start, end, pad) ids, the
    video pad id or None without a video rule) under an interleaved ``config``; ValueError when
    the tokenizer lacks a token or a setting is out of range, ``UnknownSetting`` for a key it
    does not read, ``MissingSetting`` for a required one absent.

    Config keys (kind "interleaved"): ``batch_size``, ``eos_token``, ``images``, ``layout``,
    ``max_document_bytes``, ``max_images_per_document``, ``max_patches_per_batch``,
    ``max_pixels``, ``pad_id``, ``seq_len``, ``texts``, ``threads``, ``tokenizer``, ``vision``;
    and the source options.
    ``vision`` is one dict tagged by ``family``: ``{"family": "qwen", **QwenVL.settings()}`` or
    ``NaFlexVL.settings()`` (kinds "QwenVL vision spec", "NaFlexVL vision spec"), the former
    with an optional ``video``, ``QwenVideo``'s fields (kind "QwenVideo video rule"; it needs
    FFmpeg: ``FfmpegUnavailable`` without it);
    ``layout`` is None or ``Conversations.settings()`` / ``Captions.settings()``;
    ``eos_token``, ``layout``, ``threads`` and ``pad_id`` may be absent."""

def count_interleaved(urls: list[str], config: dict[str, Any], threads: int = 1) -> list[dict[str, Any]]:
    """Per unit (Parquet row group or tar shard), in file order, under an interleaved ``config``
    (as ``interleaved_tokens``'s): url, first_row, rows, identity,
    documents, batches, text_tokens, image_tokens, images, video_tokens, videos, patches, slots,
    padded_slots, skipped (by reason), examples, error.

    Config keys (kind "interleaved"): ``batch_size``, ``eos_token``, ``images``, ``layout``,
    ``max_document_bytes``, ``max_images_per_document``, ``max_patches_per_batch``,
    ``max_pixels``, ``pad_id``, ``seq_len``, ``texts``, ``threads``, ``tokenizer``, ``vision``;
    and the source options."""

def interleaved_pipeline(
    units: Sequence[tuple[str, int, int | None, str | None]],
    counts: Sequence[int],
    reader: PlanReader,
    config: dict[str, Any],
) -> Pipeline:
    """Starts the interleaved pipeline of one ``reader``: a packed plan over batches per unit
    (batch_size, seq_len and block_rows 1). A lent buffer is the pixel region
    (max_patches_per_batch rows) and the int64
    ``[6, batch_size, seq_len]`` ids, labels, positions (restarting at every document's run and
    each row's padding) and M-RoPE's (t, h, w) positions of each run as if alone (1-D under the
    NaFlex spec); each batch's result is (patches,
    grids, cu_seqlens, max_seqlen, documents, keys, tokens, grid_is_video): the pixel rows are
    each grid's in run order, a video's where ``grid_is_video``. Its batches fail with ``CoreFault``
    naming the unit when it cannot be read or no longer makes its counted batches.

    Config keys (kind "interleaved"): ``batch_size``, ``eos_token``, ``images``, ``layout``,
    ``max_document_bytes``, ``max_images_per_document``, ``max_patches_per_batch``,
    ``max_pixels``, ``pad_id``, ``seq_len``, ``texts``, ``threads``, ``tokenizer``, ``vision``;
    and the source options."""

def budget_pipeline(
    units: Sequence[tuple[str, int, int | None, str | None]],
    counts: Sequence[int],
    reader: PlanReader,
    config: dict[str, Any],
) -> Pipeline:
    """Starts the token-budget pipeline of one ``reader``: a packed plan over batches
    per unit (batch_size, seq_len and block_rows 1). Its batches fail with ``CoreFault`` naming
    the unit when it cannot be read or no longer makes its counted batches.

    Config keys (kind "token-budget NaFlex"): ``buckets``, ``crop_seed``,
    ``max_images_per_batch``, ``max_member_bytes``, ``max_patches_per_batch``, ``naflex``,
    ``threads``, ``tokenizer``; and the source options and the sample options.
    ``tokenizer`` is a dict of kind "caption tokenizer" (``kind``: "bpe" or "json", ``path``,
    ``context_length``; ``shardstream.tokenizer.core_tokenizer``) or None."""

def settings_keys(kind: str) -> list[str]:
    """The keys the core's settings of ``kind`` take, sorted (one list with the binding's
    structs, rust/src/binding/settings.rs): "loader", "token count", "packed text",
    "token-budget NaFlex", "interleaved", "interleaved captions layout", "interleaved
    conversations layout", "QwenVL vision spec", "NaFlexVL vision spec", "NaFlex spec",
    "source", "sample", "caption tokenizer". ValueError for another kind."""

def video_sample_frames(
    total_frames: int,
    video_fps: float,
    *,
    rule: Literal["qwen-vl-utils", "transformers"] = "qwen-vl-utils",
    fps: float | None = None,
    nframes: int | None = None,
    min_frames: int = 4,
    max_frames: int = 768,
    video_start: float | None = None,
    video_end: float | None = None,
    temporal_patch_size: int = 2,
) -> tuple[list[int], int, float]:
    """The frames the Qwen path reads of a clip of ``total_frames`` frames at ``video_fps`` (its
    average frame rate): (indices, range_frames, sample_fps), rust/src/batch/video/sampling.rs.

    ``rule`` "qwen-vl-utils" spreads ``nframes`` (or ``fps`` frames a second, 2 when neither is
    given, within ``min_frames`` and ``max_frames``) from the first frame of the range
    ``video_start``..``video_end`` (seconds) to its last; "transformers" steps from the range's
    first frame. ValueError naming the argument for a bad one, or when the range holds too few
    frames."""

def video_clip_frames(
    total_frames: int,
    video_fps: float,
    num_frames: int,
    *,
    video_start: float | None = None,
    video_end: float | None = None,
) -> tuple[list[int], int, float]:
    """The ``num_frames`` frames of a CLIP clip, spread from the first frame of its range to the
    last (repeated when the range is shorter): (indices, range_frames, sample_fps). ValueError
    naming the argument for a bad one."""

def video_frame_size(
    height: int,
    width: int,
    nframes: int,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: float | None = None,
    max_pixels: float | None = None,
    total_pixels: float | None = None,
) -> tuple[int, int, tuple[int, int, int]]:
    """(resized_height, resized_width, (t, h, w) patch grid) of ``nframes`` sampled frames of a
    ``height x width`` clip under qwen-vl-utils' per-frame and total pixel budgets (``None``: its
    defaults), rust/src/batch/video/sizing.rs. ValueError naming the argument for a bad one."""

def video_probe(data: bytes, *, max_pixels: int = 64_000_000, max_seconds: float = 0.0) -> dict[str, Any]:
    """What a clip's stream header says: {codec, width, height, rotation, fps, frames,
    seconds}, rust/src/batch/video/ffmpeg/input.rs. CoreFault (corrupt_video, no_video_stream,
    unsupported_codec, too_many_pixels, video_too_long) for a bad clip; FfmpegUnavailable."""

def count_clips(urls: list[str], config: dict[str, Any], threads: int = 1) -> list[dict[str, Any]]:
    """Per unit (tar shard or Parquet row group), in file order, each sample judged a CLIP clip
    or not from its video's container header: url, first_row, rows, identity, samples, clips,
    seconds, skipped (by reason), examples, error (rust/src/batch/video/count.rs). Raises
    FfmpegUnavailable without FFmpeg.

    Config keys (kind "video clips"): ``video_keys``, ``caption_key``, ``max_pixels``,
    ``max_seconds``, ``max_member_bytes``, ``clip_times``, ``frames``, ``size``, ``batch_size``, ``threads``,
    ``tokenizer``; and the source options. ``video_keys`` is required; ``frames``, ``size``,
    ``batch_size``, ``threads`` and ``tokenizer`` are read by :func:`video_pipeline` only."""

def video_pipeline(
    units: Sequence[tuple[str, int, int | None, str | None]],
    counts: Sequence[int],
    reader: PlanReader,
    config: dict[str, Any],
) -> Pipeline:
    """Starts the CLIP clip pipeline of one ``reader``: a plan over clips per unit, a clip a
    position (batch_size B, seq_len and block_rows 1). ``next_batch`` gives (clips, texts, keys,
    urls, indices) with the lent buffer holding ``uint8 [clips, T, 3, S, S]``; its batches fail
    with ``CoreFault`` naming the unit when it cannot be read or no longer holds its counted
    clips (rust/src/batch/video/pipeline.rs).

    Config keys (kind "video clips"): ``video_keys``, ``caption_key``, ``max_pixels``,
    ``max_seconds``, ``max_member_bytes``, ``clip_times``, ``frames``, ``size``, ``batch_size``, ``threads``,
    ``tokenizer``; and the source options."""

def video_decode_frames(
    data: bytes,
    indices: list[int],
    *,
    size: tuple[int, int] | None = None,
    max_pixels: int = 64_000_000,
    max_seconds: float = 0.0,
) -> tuple[bytes, int, int, int, dict[str, Any]]:
    """A clip's frames ``indices`` decoded, converted to RGB at ``size`` (height, width) and
    turned upright: (pixels [len(indices), 3, height, width], height, width, frames_decoded,
    header info), rust/src/batch/video/decode.rs. Errors as video_probe's."""
