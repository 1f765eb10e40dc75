"""The loader's configuration: one typed, frozen definition, and the defaults it starts from.

Every default lives in the Rust core (rust/src/defaults.rs), which builds its own defaults from
it and exports it as ``_core.DEFAULTS``; :data:`DEFAULTS` is its typed view here. The loader's
keyword arguments, the CLI's options, ``read_samples`` and the ``_core`` stubs all point at it,
so changing a default there changes it everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from shardstream import _core
from shardstream.errors import OptionError

OnError = Literal["skip", "raise"]
Crop = Literal["center", "random"]


@dataclass(frozen=True)
class CoreDefaults:
    """The core's defaults (``_core.DEFAULTS``), by the names of the options they are for."""

    image_size: int
    # What validation and indexing decode to (smaller than the loader's; defaults.rs says why).
    scan_image_size: int
    caption_key: str
    image_keys: tuple[str, ...]
    max_pixels: int
    max_member_bytes: int
    crop: Crop
    random_crop_scale: tuple[float, float]
    random_crop_ratio: tuple[float, float]
    loader_on_error: OnError
    read_samples_on_error: OnError
    shuffle_buffer: int
    read_ahead: int
    prefetch: int
    connect_timeout: float
    read_timeout: float
    max_retries: int
    backoff_initial: float
    backoff_max: float
    retry_after_max: float
    cache_max_bytes: int


def _core_defaults() -> CoreDefaults:
    values = dict(_core.DEFAULTS)
    values["image_keys"] = tuple(values["image_keys"])
    values["random_crop_scale"] = tuple(values["random_crop_scale"])
    values["random_crop_ratio"] = tuple(values["random_crop_ratio"])
    return CoreDefaults(**values)


DEFAULTS = _core_defaults()


@dataclass(frozen=True)
class LoaderConfig:
    """What a :class:`shardstream.ShardLoader` decodes and reads with, checked once when made.

    This is the one definition of these options: :class:`~shardstream.ShardLoader` takes each
    field as a keyword argument of the same name and default, and keeps the result as
    ``loader.config``. Where the data comes from (``urls``, ``index``, ``sources``), the rank and
    world size, and how shards are fetched (:class:`SourceOptions`) are not part of it.
    Defaults marked "the core's" are defined once in the Rust core (``rust/src/defaults.rs``) and
    readable as :data:`shardstream.DEFAULTS`.

    Attributes:
        batch_size: Samples per batch on each rank (required). Must be > 0.
        image_size: Side of the square images, in pixels (default 224): the shorter side is
            resized to it with antialiasing, then cropped square (``crop``).
        seed: Seed of the epoch order, the shuffle and random crops (default 0). The same seed,
            epoch, world size and worker count give the identical order on every run.
        shuffle_buffer: Samples in each reader's shuffle block (default 1000). Larger mixes
            more and costs ``shuffle_buffer`` raw samples' worth of memory per reader (the
            members' bytes as read, compressed images included: decoding comes after the
            shuffle); 1 reads in plan order. Values below 1 are taken as 1.
        threads: Decode threads of the Rust pipeline per loader, or per DataLoader worker with
            :meth:`ShardLoader.dataloader` (each worker runs a pipeline of its own). None
            (default): this process's cores divided by the ranks started on the node
            (``LOCAL_WORLD_SIZE``, or an ``srun`` step's tasks on the node), and that share
            divided again among the rank's DataLoader workers, so a rank never runs more
            decode threads than its share of the cores, however many workers it has.
        drop_last: Drop the remainder of the epoch smaller than one global batch (default True),
            so every batch is full; the dropped samples are counted in ``stats["remainder"]``
            with their keys. False: the last batch of a rank may be smaller.
        on_error: A broken sample or shard (corrupt image, truncated tar, unreadable after the
            retries): ``"skip"`` (default) skips and counts it (``stats["skipped"]``, by
            reason) and, with an index, replaces it so every rank keeps the same batch count;
            ``"raise"`` raises the :class:`~shardstream.ShardError` subclass that says which.
            A pass that skips every sample it reads raises :class:`~shardstream.errors.SampleError`
            (its ``reason`` the most frequent skip reason) rather than yielding no batch.
        caption_key: The member holding the caption (default ``"txt"``); ``"json:FIELD"``
            reads FIELD of the sample's ``json`` member. For Parquet shards: the column.
        image_keys: Member extensions (Parquet: columns) tried for the image, in order; at
            least one (a text-only corpus is read by ``shardstream.TextLoader``). None
            (default): the core's ``("jpg", "jpeg", "png", "webp")``; a Parquet file with none
            of those columns written by Hugging Face ``datasets`` gives its one ``Image``
            column instead (likewise its one string column, or the one named ``text`` or
            ``caption``, for the default ``caption_key``).
        crop: ``"center"`` (default) or ``"random"`` (a random-resized crop, as open_clip's
            training transform; seeded by ``seed`` and the epoch).
        random_crop_scale: With ``crop="random"``: the range of the crop's area as a fraction of
            the image's (default ``(0.9, 1.0)``, open_clip's training transform's, which this
            kind replaces; :class:`NaFlex` has its own default).
        random_crop_ratio: With ``crop="random"``: the range of the crop's aspect ratio, width /
            height (default ``(3/4, 4/3)``). Must satisfy ``0 < low <= high``.
        samples_per_epoch: Without an index: the global samples per epoch, which fixes the
            batches per rank so every rank steps equally (required with several readers). With
            ``sources``: the mixture's epoch size (default: all samples of the sources). None
            (default) otherwise.
        read_ahead: Shards each reader opens ahead of the one it reads (default 2): hides the
            latency of remote sources.
        prefetch: Batches decoded ahead of the one handed out (default 2), each a batch buffer
            of memory. Values below 1 are taken as 1.
        max_pixels: Images with more pixels than this (read from the header, before decoding)
            are broken samples (default 64,000,000): no image can exhaust memory.
        max_member_bytes: Members larger than this, in bytes, are broken samples, never read
            (default 256 MiB).
        pin_memory: Allocate batches in pinned memory, for fast non-blocking copies to the GPU.
            None (default): when CUDA is available.
        connect_timeout: Seconds for each TCP connect and TLS handshake of a remote read
            (default 10).
        read_timeout: Seconds for each socket read (default 30); a stalled stream is retried.
        max_retries: Consecutive failed attempts without a byte of progress before a shard is
            given up (default 8): then ``on_error`` decides. The waits between attempts are
            :class:`SourceOptions` ``backoff_initial`` and ``backoff_max``.
        tokenizer: Tokenize captions in the loader's Rust threads into ``Batch.tokens``: an
            open_clip model name (``"ViT-B-32"``: CLIP's BPE, token-identical to open_clip's)
            or a Hugging Face ``tokenizer.json`` path. None (default): no tokens.
        context_length: Tokens per caption, padded or truncated. None (default): the
            tokenizer's own (the model's, 77 for a ``tokenizer.json``). Must be >= 2.

    Raises:
        OptionError: (a ``ValueError``) a field is out of range; ``option`` names it.
    """

    batch_size: int
    image_size: int = DEFAULTS.image_size
    seed: int = 0
    shuffle_buffer: int = DEFAULTS.shuffle_buffer
    threads: int | None = None
    drop_last: bool = True
    on_error: OnError = DEFAULTS.loader_on_error
    caption_key: str = DEFAULTS.caption_key
    image_keys: tuple[str, ...] | None = None
    crop: Crop = DEFAULTS.crop
    random_crop_scale: tuple[float, float] = DEFAULTS.random_crop_scale
    random_crop_ratio: tuple[float, float] = DEFAULTS.random_crop_ratio
    samples_per_epoch: int | None = None
    read_ahead: int = DEFAULTS.read_ahead
    prefetch: int = DEFAULTS.prefetch
    max_pixels: int = DEFAULTS.max_pixels
    max_member_bytes: int = DEFAULTS.max_member_bytes
    pin_memory: bool | None = None
    connect_timeout: float = DEFAULTS.connect_timeout
    read_timeout: float = DEFAULTS.read_timeout
    max_retries: int = DEFAULTS.max_retries
    tokenizer: str | None = None
    context_length: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise OptionError("batch_size", f"must be positive, got {self.batch_size}")
        if self.on_error not in ("skip", "raise"):
            raise OptionError("on_error", f"must be 'skip' or 'raise', got {self.on_error!r}")
        if self.crop not in ("center", "random"):
            raise OptionError("crop", f"must be 'center' or 'random', got {self.crop!r}")
        ratio = tuple(self.random_crop_ratio)
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1] < float("inf")):
            raise OptionError("random_crop_ratio", f"must be two aspect ratios 0 < low <= high, got {ratio}")
        if self.context_length is not None and self.context_length < 2:
            raise OptionError("context_length", f"must be at least 2, got {self.context_length}")
        if self.image_keys is not None and not self.image_keys:
            # No image key would make every sample a counted skip and the loader empty: a corpus
            # without images is another kind of sample, with its own loader.
            raise OptionError(
                "image_keys",
                "must name at least one image member or column (None: the defaults); a text-only "
                "corpus is read by the text kind: shardstream.TextLoader, with token counts from "
                "shardstream.count_tokens",
            )
        # Sequences are kept as tuples, so that the configuration stays immutable.
        if self.image_keys is not None:
            object.__setattr__(self, "image_keys", tuple(self.image_keys))
        object.__setattr__(self, "random_crop_scale", tuple(self.random_crop_scale))
        object.__setattr__(self, "random_crop_ratio", ratio)

    def core_config(self) -> dict[str, Any]:
        """The options the Rust pipeline reads (``_core.sample_pipeline``'s config), by its key names.
        What the loader itself handles (seed, shuffle buffer, threads, prefetch, pinning, the
        tokenizer's resolution) is left out: the loader passes those in their resolved form."""
        handled_by_loader = (
            "seed",
            "shuffle_buffer",
            "threads",
            "samples_per_epoch",
            "prefetch",
            "pin_memory",
            "tokenizer",
            "context_length",
        )
        config = asdict(self)
        for key in handled_by_loader:
            del config[key]
        return config


# -- where the bytes come from -------------------------------------------------------------------

# S3's own limit for a presigned URL made with long-term keys: seven days.
_MAX_EXPIRES_IN = 7 * 24 * 3600
_CHECKS = ("first", "all", "none")
_ADDRESSING_STYLES = ("path", "virtual", "auto")
# Keywords the deprecated ``**source_options`` form also took, mapped to the field they set.
_KEYWORD_ALIASES = {"region_name": "region"}


@dataclass(frozen=True)
class SourceOptions:
    """How shards are fetched: S3 endpoint and credentials profile, TLS roots, retry backoff,
    and the on-disk shard cache. One frozen, checked object, given as
    ``ShardLoader(..., source=SourceOptions(...))`` or ``read_samples(..., source=...)``.

    Every field has a default that works for local files, public ``http(s)://`` and ``hf://``
    URLs, and AWS S3 with boto3's usual configuration; set only what differs. The connect and
    read timeouts and the retry count are not here: they are :class:`LoaderConfig` fields
    (``connect_timeout``, ``read_timeout``, ``max_retries``), keyword arguments of
    :class:`ShardLoader` and :func:`read_samples` themselves.

    Example:
        >>> SourceOptions(endpoint_url="http://127.0.0.1:8333", region="us-east-1").region
        'us-east-1'

    Attributes:
        endpoint_url: S3 endpoint for an S3-compatible store (MinIO, SeaweedFS, R2, ...), e.g.
            ``"https://s3.example.com"``. None (default): ``AWS_ENDPOINT_URL_S3``, then
            ``AWS_ENDPOINT_URL``, then AWS itself. Must start with ``http://`` or ``https://``.
        region: S3 region, e.g. ``"us-east-1"``. None (default): boto3's (``AWS_REGION``,
            ``AWS_DEFAULT_REGION``, the profile), else ``"us-east-1"``.
        profile: Named profile of ``~/.aws/config`` whose credentials and settings S3 uses.
            None (default): boto3's credential chain (environment, ``AWS_PROFILE``, files,
            instance role).
        expires_in: Seconds a presigned S3 URL stays valid (default 3600). Shards are signed each
            time they are opened, so this only needs to cover one read of one shard. 1 to
            604800 (seven days, S3's limit).
        addressing_style: ``"path"``, ``"virtual"`` or ``"auto"``. None (default): ``"path"``
            with a custom ``endpoint_url``, else ``"auto"``.
        ca_bundle: PEM file of the certificate authorities trusted for HTTPS, for the Rust reader
            and for boto3 (an endpoint behind a private CA). None (default): the system roots,
            or ``AWS_CA_BUNDLE`` for S3. The file must exist.
        backoff_initial: Seconds before the first retry of a failed request (default 0.2,
            the core's); doubles per consecutive failure, with jitter. Must be > 0.
        backoff_max: The longest wait between two retries, in seconds (default 10). Must be > 0.
        retry_after_max: The longest ``Retry-After`` (429/503) a read waits for, in seconds
            (default 300); a server asking for longer fails that read (``throttled``). Must be >= 0.
        cache_dir: Folder of an on-disk shard cache shared by the processes of one machine (LRU,
            each shard downloaded once). None (default): no cache. A folder that cannot be
            used does not stop reading: shards come from the source and one warning says why.
        cache_max_bytes: Size the cache may grow to, in bytes (default 64 GiB). Must be > 0;
            used only with ``cache_dir``.
        check: What is verified when the URLs are expanded, before any training step:
            ``"first"`` (default) the first shard of each folder or prefix exists and is readable
            with the credentials at hand; ``"all"`` every shard (one request each); ``"none"``
            nothing (a missing shard is then reported when read and handled by ``on_error``).

    Raises:
        OptionError: (a ``ValueError``) a field has a value out of range; its ``option`` names
            the field.
        TypeError: a field has the wrong type.
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    expires_in: int = 3600
    addressing_style: Literal["path", "virtual", "auto"] | None = None
    ca_bundle: str | None = None
    backoff_initial: float = DEFAULTS.backoff_initial
    backoff_max: float = DEFAULTS.backoff_max
    retry_after_max: float = DEFAULTS.retry_after_max
    cache_dir: str | None = None
    cache_max_bytes: int = DEFAULTS.cache_max_bytes
    check: Literal["first", "all", "none"] = "first"

    def __post_init__(self) -> None:
        for name in ("endpoint_url", "region", "profile", "addressing_style", "check"):
            _expect_type(name, getattr(self, name), str, optional=name != "check")
        for name in ("ca_bundle", "cache_dir"):
            value = getattr(self, name)
            if value is not None:
                _expect_type(name, value, (str, os.PathLike))
                object.__setattr__(self, name, os.fspath(value))
        for name in ("backoff_initial", "backoff_max", "retry_after_max"):
            _expect_type(name, getattr(self, name), (int, float))
        for name in ("expires_in", "cache_max_bytes"):
            _expect_type(name, getattr(self, name), int)
        if self.endpoint_url is not None and not self.endpoint_url.startswith(("http://", "https://")):
            raise OptionError("endpoint_url", f"must be an http(s):// URL, got {self.endpoint_url!r}")
        for name in ("region", "profile"):
            if getattr(self, name) == "":
                raise OptionError(name, "must not be empty (None: boto3's own)")
        if not 1 <= self.expires_in <= _MAX_EXPIRES_IN:
            raise OptionError("expires_in", f"must be 1 to {_MAX_EXPIRES_IN} seconds, got {self.expires_in}")
        if self.addressing_style is not None and self.addressing_style not in _ADDRESSING_STYLES:
            raise OptionError(
                "addressing_style", f"must be one of {_ADDRESSING_STYLES}, got {self.addressing_style!r}"
            )
        if self.ca_bundle is not None and not os.path.isfile(self.ca_bundle):
            raise OptionError("ca_bundle", f"no such file: {self.ca_bundle}")
        for name in ("backoff_initial", "backoff_max"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise OptionError(name, f"must be a positive number of seconds, got {value!r}")
        if not (math.isfinite(self.retry_after_max) and self.retry_after_max >= 0):
            raise OptionError("retry_after_max", f"must be >= 0 seconds, got {self.retry_after_max!r}")
        if self.cache_max_bytes <= 0:
            raise OptionError("cache_max_bytes", f"must be positive, got {self.cache_max_bytes}")
        if self.check not in _CHECKS:
            raise OptionError("check", f"must be one of {_CHECKS}, got {self.check!r}")

    def keywords(self) -> dict[str, Any]:
        """The options as the keyword arguments the URL expansion and the reader take (fields
        left at None are left out, so boto3 and the environment decide them).

        Returns:
            A new dict, field name to value.
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any], caller: str) -> SourceOptions:
        """The options named by the deprecated keyword form (``ShardLoader(endpoint_url=...)``),
        with a :class:`DeprecationWarning` that shows the replacement.

        Args:
            keywords: The keyword arguments the caller did not know itself. ``region_name`` is
                taken for ``region``, and ``s3_options`` (a dict of S3 fields) is unpacked, as
                before.
            caller: The function's name, for the messages (e.g. ``"ShardLoader"``).

        Returns:
            The options those keywords set, the others at their defaults.

        Raises:
            TypeError: a keyword is not a :class:`SourceOptions` field (its name is in the
                message, as Python says it for any unexpected keyword argument).
            OptionError: a value is refused, as by the constructor.
        """
        values = dict(keywords)
        nested = values.pop("s3_options", None)
        if nested is not None:
            nested = asdict(nested) if dataclasses.is_dataclass(nested) else dict(nested)
            values = {**nested, **values}
        for old, new in _KEYWORD_ALIASES.items():
            if old in values:
                values[new] = values.pop(old)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        options = cls(**values)
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        warnings.warn(
            f"{caller}({', '.join(values)}=...) is deprecated and will be removed in the next release: "
            f"pass source=shardstream.SourceOptions({shown})",
            DeprecationWarning,
            stacklevel=4,  # the user's call, past resolve_source_options and the caller
        )
        return options


def resolve_source_options(
    source: SourceOptions | None, keywords: dict[str, Any], caller: str
) -> dict[str, Any]:
    """The keyword dict the URL expansion and the reader take, from ``source=`` or from the
    deprecated keyword form (not both).

    Args:
        source: What the caller passed as ``source=``, or None.
        keywords: The caller's leftover keyword arguments (the deprecated form).
        caller: The function's name, for messages.

    Returns:
        Field name to value, as :meth:`SourceOptions.keywords`.

    Raises:
        TypeError: ``source`` is not a :class:`SourceOptions`, both forms are given, or a
            keyword is unknown.
    """
    if source is not None and not isinstance(source, SourceOptions):
        got = type(source).__name__
        raise TypeError(f"{caller}(source=...) takes a shardstream.SourceOptions, got {got}")
    if keywords:
        if source is not None:
            raise TypeError(
                f"{caller}() got source= and the keyword form ({', '.join(sorted(keywords))}): "
                "give only source=SourceOptions(...)"
            )
        source = SourceOptions.from_keywords(keywords, caller)
    return (source or SourceOptions()).keywords()


def _expect_type(name: str, value: Any, types: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, types):
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise TypeError(f"{name} must be {expected}{' or None' if optional else ''}, got {value!r}")
