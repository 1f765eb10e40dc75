"""Content identity of shards: what an index records per shard so that re-indexing a grown or
changed dataset can tell which shards are unchanged (and reuse their entries) without reading them.

- a local file: ``size:<bytes>,mtime_ns:<n>`` (one ``stat``);
- http(s): ``etag:<ETag>`` when the server sends one, else ``size:<Content-Length>,last-modified:<date>``
  (one ``HEAD`` request; a server refusing ``HEAD`` gets a one-byte ``GET``);
- hf: ``size:<bytes>,hf-oid:<blob id>`` from the tree listing (the URL names a commit);
- s3: ``etag:<ETag>``, from the listing when the shards were found by listing a prefix or glob
  (no request at all), else from one ``HeadObject``.

Probes run in parallel on a bounded number of threads, every network call with a timeout. A
shard whose identity cannot be determined gets none: an update always rescans it.
"""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shardstream.config import DEFAULTS
from shardstream.errors import ShardError
from shardstream.urls import Shard, parse_s3_url, scheme_of, source_config

# Probes in flight at once (latency-bound, like the img2dataset stats reads).
IDENTITY_PROBES = 32
DEFAULT_TIMEOUT = DEFAULTS.read_timeout


@dataclass(frozen=True)
class ShardIdentity:
    """What a probe found: the size in bytes and the identity string (None: unknown)."""

    size: int | None = None
    identity: str | None = None


UNKNOWN = ShardIdentity()


def probe_identity(
    shard: Shard, *, timeout: float = DEFAULT_TIMEOUT, ca_bundle: str | None = None
) -> ShardIdentity:
    """The identity of one shard; UNKNOWN when it cannot be determined (never raises for a
    missing or unreachable shard: the scan reports that, by name)."""
    url = shard.url
    scheme = scheme_of(url)
    try:
        if scheme in ("local", "file"):
            st = os.stat(url.removeprefix("file://"))
            return ShardIdentity(st.st_size, f"size:{st.st_size},mtime_ns:{st.st_mtime_ns}")
        if url.startswith("s3://"):
            return _s3_identity(shard)
        if scheme == "hf":
            from shardstream.hub import hf_identity

            return ShardIdentity(*hf_identity(getattr(shard, "listed", None)))
        if scheme in ("http", "https"):
            return _http_identity(shard, timeout=timeout, ca_bundle=ca_bundle)
    except (ShardError, OSError, ValueError):
        pass
    return UNKNOWN


def probe_identities(
    shards: Sequence[Shard],
    *,
    threads: int = IDENTITY_PROBES,
    timeout: float = DEFAULT_TIMEOUT,
    source_options: dict[str, Any] | None = None,
    on_done: Callable[[], None] | None = None,
) -> list[ShardIdentity]:
    """:func:`probe_identity` of every shard, in order, on at most ``threads`` threads."""
    if not shards:
        return []
    ca_bundle = source_config(shards, source_options).get("ca_bundle")

    def probe(shard: Shard) -> ShardIdentity:
        result = probe_identity(shard, timeout=timeout, ca_bundle=ca_bundle)
        if on_done is not None:
            on_done()
        return result

    with ThreadPoolExecutor(max(1, min(threads, len(shards))), thread_name_prefix="shardstream-id") as pool:
        return list(pool.map(probe, shards))


def _s3_identity(shard: Shard) -> ShardIdentity:
    listed = getattr(shard, "listed", None)
    if listed is not None:
        size, etag = listed
        return ShardIdentity(size, f"etag:{etag}")
    if shard.signer is None:
        return UNKNOWN
    from shardstream.urls import _s3_call

    bucket, key = parse_s3_url(shard.url)
    # The client's config bounds connect and read time (and retries) of every call.
    head = _s3_call(shard.display, shard.signer.client(shard.url).head_object, Bucket=bucket, Key=key)
    etag, size = head.get("ETag"), head.get("ContentLength")
    return ShardIdentity(int(size) if size is not None else None, f"etag:{etag}" if etag else None)


def _http_identity(shard: Shard, *, timeout: float, ca_bundle: str | None) -> ShardIdentity:
    context = ssl.create_default_context(cafile=os.fspath(ca_bundle)) if ca_bundle else None
    try:
        request = urllib.request.Request(shard.open_url(), method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
            headers = response.headers
            size_text = headers.get("Content-Length")
    except urllib.error.HTTPError as e:
        if e.code not in (405, 501):
            return UNKNOWN
        # No HEAD here: the first byte, whose Content-Range says the whole size.
        request = urllib.request.Request(shard.open_url(), headers={"Range": "bytes=0-0"})
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
            headers = response.headers
            total = (headers.get("Content-Range") or "").rpartition("/")[2]
            size_text = total if response.status == 206 else headers.get("Content-Length")
    size = int(size_text) if size_text and size_text.strip().isdigit() else None
    etag = headers.get("ETag")
    if etag:
        return ShardIdentity(size, f"etag:{etag.strip()}")
    modified = headers.get("Last-Modified")
    if size is not None and modified:
        return ShardIdentity(size, f"size:{size},last-modified:{modified.strip()}")
    return ShardIdentity(size, None)
