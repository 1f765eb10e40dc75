"""Raw samples, grouped exactly as webdataset groups tar members."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardstream import _core
from shardstream.config import DEFAULTS, OnError, SourceOptions, resolve_source_options
from shardstream.errors import from_core_fault
from shardstream.urls import expand_urls, source_config


def read_samples(
    urls: str | list[str],
    *,
    on_error: OnError = DEFAULTS.read_samples_on_error,
    max_member_bytes: int = DEFAULTS.max_member_bytes,
    connect_timeout: float = DEFAULTS.connect_timeout,
    read_timeout: float = DEFAULTS.read_timeout,
    max_retries: int = DEFAULTS.max_retries,
    source: SourceOptions | None = None,
    **source_options: Any,
) -> Iterator[dict[str, Any]]:
    """Raw samples of WebDataset shards, one dict per sample, without decoding anything.

    Members are grouped exactly as webdataset groups them: a sample's key is the member path up
    to the first ``.`` of its last path component, and consecutive members with the same key
    form one sample.

    Example:
        >>> for sample in read_samples("data/shard-{000000..000009}.tar"):  # doctest: +SKIP
        ...     print(sample["__key__"], len(sample["jpg"]), sample["txt"].decode())

    Args:
        urls: The shards: a path, a folder (its ``.tar``/``.tar.gz``/``.tgz`` files), a glob, a
            URL (``file://``, ``http(s)://``, ``s3://``, ``hf://datasets/...``) with brace
            expansion (``{000000..000099}``) and ``::``-separated lists, or a list of those.
        on_error: ``"raise"`` (default) raises on the first broken shard or sample (truncated
            tar, duplicate member names, a member over ``max_member_bytes``, an unreadable
            shard); ``"skip"`` skips it and goes on.
        max_member_bytes: The largest member read, in bytes (default: the core's,
            :data:`shardstream.DEFAULTS`); a larger one is a broken sample.
        connect_timeout: As :class:`shardstream.LoaderConfig`.
        read_timeout: As :class:`shardstream.LoaderConfig`.
        max_retries: As :class:`shardstream.LoaderConfig`.
        source: How shards are fetched (S3 endpoint, TLS roots, backoff, cache): see
            :class:`shardstream.SourceOptions`. None: its defaults.
        **source_options: Deprecated: the fields of :class:`~shardstream.SourceOptions` as
            keywords (a :class:`DeprecationWarning` says so); removed in the next release.

    Yields:
        One dict per sample: ``"__key__"`` (str), ``"__url__"`` (the shard's URL, redacted) and
        one ``bytes`` value per member extension, lower-cased (e.g. ``"jpg"``, ``"txt"``,
        ``"json"``).

    Raises:
        ShardError: With ``on_error="raise"``, a broken shard or sample (a subclass says which
            kind: :class:`~shardstream.NotFoundError`, :class:`~shardstream.CredentialsError`,
            :class:`~shardstream.SampleError`, ...).
        BadUrlError: A URL that is refused (``pipe:``, an unknown scheme, a malformed range).
        TypeError: An unknown keyword argument, or ``source`` and the keyword form together.
    """
    options = resolve_source_options(source, source_options, "read_samples")
    shards = expand_urls(urls, **options)
    concrete = [s.url for s in shards]
    display = [s.display for s in shards]
    reader = {"connect_timeout": connect_timeout, "read_timeout": read_timeout, "max_retries": max_retries}
    config = source_config(shards, {**options, **reader})
    # Options and URLs are checked above, at the call; the samples are read as they are asked for.
    return _samples(_core.SampleIter(concrete, display, on_error, max_member_bytes, config))


def _samples(it: Any) -> Iterator[dict[str, Any]]:
    while True:
        try:
            sample = next(it)
        except StopIteration:
            return
        except _core.CoreFault as fault:
            raise from_core_fault(fault) from None
        yield sample
