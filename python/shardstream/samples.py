"""Raw samples, grouped exactly as webdataset groups tar members."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardstream import _core
from shardstream.config import DEFAULTS, OnError
from shardstream.errors import from_core_fault
from shardstream.urls import expand_urls, source_config


def read_samples(
    urls: str | list[str],
    *,
    on_error: OnError = DEFAULTS.read_samples_on_error,
    max_member_bytes: int = DEFAULTS.max_member_bytes,
    **source_options: Any,
) -> Iterator[dict[str, Any]]:
    """Yields one dict per sample: ``__key__``, ``__url__`` and one ``bytes`` value per member
    extension (lower-cased, e.g. ``"jpg"``, ``"txt"``, ``"json"``). No decoding.

    ``urls``: a path, a URL (``file://``, ``http(s)://``, ``s3://``) with brace expansion and
    ``::``-separated lists, or a list of those. ``on_error="skip"`` skips broken shards and
    samples (truncated tar, duplicate member names, oversized members) instead of raising.
    """
    shards = expand_urls(urls, **source_options)
    concrete = [s.url for s in shards]
    display = [s.display for s in shards]
    config = source_config(shards, source_options)
    it = _core.SampleIter(concrete, display, on_error, max_member_bytes, config)
    while True:
        try:
            sample = next(it)
        except StopIteration:
            return
        except _core.CoreFault as fault:
            raise from_core_fault(fault) from None
        yield sample
