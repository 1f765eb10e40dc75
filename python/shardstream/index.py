"""The dataset index: per shard its URL, size, sample count, per-sample byte offsets and the
samples validation rejected. It makes epochs exact (see ``shardstream.plan``).

Two layouts, defined once in rust/src/index/ and documented in docs/epoch-plan.md:

- a folder (the default): ``manifest.bin``, what every rank loads, O(shards), and detail files
  with each shard's offsets and keys, which a reader fetches per shard when it opens it;
- version 1, one JSON file (``-o NAME.json`` or ``NAME.json.gz``), for small datasets.

This module loads, builds and writes them.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shardstream import _core, validation
from shardstream._files import atomic_write
from shardstream.config import SourceOptions, resolve_source_options
from shardstream.errors import CredentialsError, NotFoundError, ShardError
from shardstream.identity import ShardIdentity, probe_identities
from shardstream.urls import Shard, expand_urls, redact, scheme_of, source_config

DatasetIndex = _core.DatasetIndex
MANIFEST_NAME = "manifest.bin"
# Reads of img2dataset stats files in flight at once (small files: latency-bound, not CPU-bound).
STATS_READERS = 32


def is_json_index_path(path: str) -> bool:
    """Whether ``path`` names a version-1 JSON index file rather than a folder layout."""
    name = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    return name.endswith((".json", ".json.gz"))


def _manifest_location(where: str) -> tuple[str, str]:
    """(URL or path of the manifest, the folder its detail files are in) for an index named by
    its folder or by its manifest file."""
    path, sep, query = where.partition("?")
    if path.rstrip("/").endswith("/" + MANIFEST_NAME) or path == MANIFEST_NAME:
        folder = path.rstrip("/")[: -len(MANIFEST_NAME)].rstrip("/") or "."
        return where, folder + (sep + query if sep else "")
    folder = path.rstrip("/")
    return f"{folder}/{MANIFEST_NAME}" + (sep + query if sep else ""), folder + (sep + query if sep else "")


def _read_bytes(where: str, what: str, *, timeout: float, **source_options: Any) -> bytes:
    """The whole content of a small file (an index, a stats file) at a path or URL."""
    if scheme_of(where) == "local" or where.startswith("file://"):
        return _fetch(Shard(where, where), what, timeout=timeout)
    (url,) = expand_urls(where, **source_options)
    return _fetch(url, what, timeout=timeout, ca_bundle=source_config([url], source_options).get("ca_bundle"))


def _fetch(shard: Shard, what: str, *, timeout: float, ca_bundle: str | None = None) -> bytes:
    """The whole content of one small file, named by an expanded URL; ``ca_bundle``: the PEM roots
    to trust for HTTPS instead of the system's (as the shard reader does)."""
    if scheme_of(shard.url) == "local" or shard.url.startswith("file://"):
        try:
            with open(shard.url.removeprefix("file://"), "rb") as f:
                return f.read()
        except OSError as e:
            raise ShardError("unreadable", shard.display, "", f"cannot read {what}: {e.strerror}") from None
    try:
        context = ssl.create_default_context(cafile=os.fspath(ca_bundle)) if ca_bundle else None
        url, headers = shard.open_request()
        request = urllib.request.Request(url)
        for name, value in headers.items():
            # Unredirected: a Hub token is not sent on to the storage host a resolve redirects to.
            request.add_unredirected_header(name, value)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
            return response.read()
    except urllib.error.HTTPError as e:
        kind = {404: NotFoundError, 410: NotFoundError, 401: CredentialsError, 403: CredentialsError}
        error = kind.get(e.code, ShardError)
        raise error("unreadable", shard.display, "", f"cannot fetch {what}: HTTP {e.code}") from None
    except OSError as e:
        raise ShardError("unreadable", shard.display, "", f"cannot fetch {what}: {e}") from None


def load_index(source: Any, *, timeout: float = 60.0, **source_options: Any) -> DatasetIndex:
    """An index from a DatasetIndex, bytes, or where ``shardstream index -o`` wrote it: a folder
    (or its ``manifest.bin``) or a version-1 JSON file, as a local path or an http(s)/s3 URL.
    Only the manifest is read: per-sample detail is fetched per shard, when it is opened."""
    if isinstance(source, DatasetIndex):
        return source
    location = None
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
        where = "<bytes>"
    else:
        where = os.fspath(source)
        local = scheme_of(where) == "local" or where.startswith("file://")
        folder_layout = (
            os.path.isdir(where.removeprefix("file://")) if local else not is_json_index_path(where)
        ) or where.rstrip("/").endswith("/" + MANIFEST_NAME)
        if folder_layout:
            where, location = _manifest_location(where)
        data = _read_bytes(where, "index", timeout=timeout, **source_options)
    try:
        return DatasetIndex.from_bytes(data, location)
    except ValueError as e:
        raise ShardError("corrupt_tar", redact(where), "", f"not a shardstream index: {e}") from None


def index_from_img2dataset(spec: Any, *, timeout: float = 60.0, **source_options: Any) -> DatasetIndex:
    """An index from the ``NNNNN_stats.json`` files img2dataset writes next to its shards: no
    scan needed, exact epochs from the sample counts (no offsets: shards are read from their
    start, and samples are validated only at run time)."""
    shards = expand_urls(spec, **source_options)
    stats_urls = []
    for shard in shards:
        stats_url = DatasetIndex.img2dataset_stats_url(shard.display)
        if stats_url is None:
            raise ShardError(
                "unreadable", shard.display, "", "not a .tar/.tar.gz/.tgz shard: no img2dataset stats"
            )
        stats_urls.append(stats_url)
    # One expansion for every stats file: one S3 client for thousands of them, and no existence
    # check (a missing file fails its own read, by name).
    stats = expand_urls(stats_urls, check="none", **source_options)
    ca_bundle = source_config(stats, source_options).get("ca_bundle")

    def read(stat: Shard) -> bytes:
        return _fetch(stat, "img2dataset stats", timeout=timeout, ca_bundle=ca_bundle)

    # Latency-bound small reads, a bounded number in flight: 230k files take minutes, not hours.
    with ThreadPoolExecutor(max_workers=min(STATS_READERS, max(1, len(stats)))) as pool:
        contents = list(pool.map(read, stats))
    entries = [(index_name(shard), data) for shard, data in zip(shards, contents, strict=True)]
    try:
        return DatasetIndex.from_img2dataset_stats(entries)
    except ValueError as e:
        raise ShardError("unreadable", "", "", str(e)) from None


def scan_shards(
    urls: Iterable[Any],
    *,
    threads: int | None = None,
    source_options: dict[str, Any] | None = None,
    **scan_options: Any,
) -> list[dict[str, Any]]:
    """The scan reports an index is built from: the one scan (``shardstream.validation``, with
    its defaults; ``scan_options`` are :class:`~shardstream.validation.ScanOptions` fields), per-
    sample offsets and keys kept, reader options among ``source_options``. A shard that cannot
    be read raises ShardError: an index without it would silently drop its samples."""
    shards = [url if isinstance(url, Shard) else Shard(str(url)) for url in urls]
    return validation.scan_shards(
        shards,
        validation.ScanOptions(**scan_options),
        threads=threads,
        on_unreadable="raise",
        source_options=source_options,
        keep_offsets=True,
    )


def _scan_for_index(shards: Sequence[Shard], **scan_options: Any) -> list[dict[str, Any]]:
    """:func:`scan_shards`, its error saying that no index came of it."""
    try:
        return scan_shards(shards, **scan_options)
    except ShardError as e:
        raise type(e)(e.reason, e.url, e.key, f"{e.detail}: no index written") from None


def index_name(shard: Shard | str) -> str:
    """The name an index records for a shard: its display, a relative local path made absolute.
    A relative path would mean something else to a loader started in another directory; an
    absolute one names the same file from anywhere (remote URLs are absolute already)."""
    name = shard.display if isinstance(shard, Shard) else str(shard)
    if scheme_of(name) == "local" and not os.path.isabs(name):
        return os.path.abspath(name)
    return name


def index_from_reports(
    reports: list[dict[str, Any]], urls: list[str] | None = None, *, with_keys: bool = True
) -> DatasetIndex:
    """An index from scan reports; ``urls`` are the names users give the shards (default: the
    reports' own, already redacted, URLs)."""
    names = urls if urls is not None else [r["url"] for r in reports]
    return DatasetIndex.from_scan_reports(json.dumps(reports), [str(n) for n in names], with_keys)


def build_index(
    spec: Any,
    *,
    decode: bool = True,
    threads: int | None = None,
    with_keys: bool = True,
    caption_key: str = validation.ScanOptions.caption_key,
    image_keys: Sequence[str] = validation.ScanOptions.image_keys,
    require_caption: bool = validation.ScanOptions.require_caption,
    max_pixels: int = validation.ScanOptions.max_pixels,
    max_member_bytes: int = validation.ScanOptions.max_member_bytes,
    image_size: int = validation.ScanOptions.image_size,
    source: SourceOptions | None = None,
    source_options: dict[str, Any] | None = None,
) -> DatasetIndex:
    """The dataset index of the shards of ``spec``: what makes epochs exact and mid-epoch resume
    possible (``ShardLoader(urls, index=...)``). The library form of ``shardstream index``.

    Every shard is scanned (on ``threads`` threads) and, unless ``decode=False``, every sample is
    validated as the loader would decode it; invalid samples are recorded in the index and never
    scheduled. Each shard's content identity (size and ETag, mtime, or Hub blob id) is recorded,
    so a later ``shardstream index`` of a grown dataset rescans only what changed.

    Example:
        >>> index = build_index("shards/shard-{000000..000009}.tar")  # doctest: +SKIP
        >>> write_index(index, "shards.index")  # doctest: +SKIP

    Args:
        spec: The shards, as ``urls`` of :class:`shardstream.ShardLoader` (paths, globs, brace
            ranges, ``http(s)://``, ``s3://``, ``hf://``).
        decode: Decode every image to validate it (default True); False checks only the tar
            structure and members (several times faster).
        threads: Shards scanned at once; None: chosen from the cores (and, for remote shards,
            more, since they wait on the network).
        with_keys: Record every sample's key (default True): ``stats["remainder_keys"]`` and
            subsets by key need them; False makes the index smaller.
        caption_key: The member holding the caption (default ``"txt"``), as the loader's.
        image_keys: The member extensions tried for the image, in order (default
            ``("jpg", "jpeg", "png", "webp")``, the core's).
        require_caption: A sample without a caption is invalid (default True).
        max_pixels: Images with more pixels than this are invalid (default: the core's).
        max_member_bytes: Members larger than this, in bytes, are invalid (default: the core's).
        image_size: The side validation decodes to, in pixels (default: the core's scan size,
            smaller than the loader's for speed; a decode error does not depend on it).
        source: How shards are fetched: see :class:`shardstream.SourceOptions`.
        source_options: The lower-level form of ``source`` as a dict, which also takes
            ``connect_timeout``, ``read_timeout`` and ``max_retries`` (see
            :class:`shardstream.LoaderConfig`); merged over ``source``'s.

    Returns:
        The index (``shardstream._core.DatasetIndex``): write it with :func:`write_index`, or
        pass it to ``ShardLoader(index=...)`` directly.

    Raises:
        ShardError: A shard cannot be read (an index without it would silently drop its
            samples); nothing is returned.
        BadUrlError: A URL of ``spec`` is refused.
    """
    options = {**resolve_source_options(source, {}, "build_index"), **(source_options or {})}
    shards = expand_urls(spec, **options)
    identities = probe_identities(shards, source_options=options)
    reports = _scan_for_index(
        shards,
        threads=threads,
        decode=decode,
        source_options=options,
        caption_key=caption_key,
        image_keys=tuple(image_keys),
        require_caption=require_caption,
        max_pixels=max_pixels,
        max_member_bytes=max_member_bytes,
        image_size=image_size,
    )
    with_identities(reports, identities)
    return index_from_reports(reports, [index_name(s) for s in shards], with_keys=with_keys)


def with_identities(
    reports: list[dict[str, Any]], identities: Sequence[ShardIdentity]
) -> list[dict[str, Any]]:
    """Puts each shard's identity (probed before its scan) into its scan report, for the index."""
    for report, found in zip(reports, identities, strict=True):
        if found.identity is not None:
            report["identity"] = found.identity
    return reports


# -- updating an index: reuse unchanged shards, scan new or changed ones ----------------------------


@dataclass(frozen=True)
class UpdatePlan:
    """Which shards of the new list come from the old index and which must be scanned."""

    reuse: dict[int, int]  # position in the new list -> position in the old index
    scan: list[int]  # positions in the new list, in order
    dropped: list[str]  # URLs in the old index that the new list does not name


@dataclass(frozen=True)
class IndexUpdate:
    """What :func:`update_index` did."""

    index: DatasetIndex
    reused: int
    scanned: list[str]  # URLs of the shards scanned, in order
    dropped: list[str]
    reports: list[dict[str, Any]]  # the scan reports of the scanned shards


def existing_index(path: str) -> DatasetIndex | None:
    """The folder index at ``path`` if there is one (a local folder holding ``manifest.bin``);
    None when there is none. A damaged manifest raises ShardError."""
    if is_json_index_path(path) or not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        return None
    return load_index(path)


def plan_update(
    old: DatasetIndex | None, urls: Sequence[str], identities: Sequence[ShardIdentity]
) -> UpdatePlan:
    """Shard i of ``urls`` is reused when the old index has its URL with the same identity (and
    the same size, when both are known); shards whose identity is unknown are always scanned.
    Deterministic: every rank that runs it on the same inputs gets the same plan."""
    recorded: dict[str, tuple[int, int | None, str | None]] = {}
    if old is not None:
        for position, (url, size, identity) in enumerate(old.shard_identities()):
            recorded.setdefault(url, (position, size, identity))
    reuse: dict[int, int] = {}
    scan: list[int] = []
    for i, (url, now) in enumerate(zip(urls, identities, strict=True)):
        before = recorded.get(url)
        if (
            before is not None
            and now.identity is not None
            and before[2] == now.identity
            and (before[1] is None or now.size is None or before[1] == now.size)
        ):
            reuse[i] = before[0]
        else:
            scan.append(i)
    named = set(urls)
    dropped = [url for url in recorded if url not in named]
    return UpdatePlan(reuse, scan, dropped)


def assemble_update(
    plan: UpdatePlan,
    old: DatasetIndex | None,
    urls: Sequence[str],
    reports: list[dict[str, Any]],
    *,
    with_keys: bool = True,
) -> DatasetIndex:
    """The index of ``urls``, in their order: reused shards as the old index has them (their
    detail stays where it is, referenced), scanned ones from ``reports`` (one per ``plan.scan``)."""
    if len(reports) != len(plan.scan):
        raise ValueError(f"{len(reports)} scan reports for {len(plan.scan)} shards to scan")
    if not plan.reuse:
        return index_from_reports(reports, [urls[i] for i in plan.scan], with_keys=with_keys)
    assert old is not None
    scanned = (
        index_from_reports(reports, [urls[i] for i in plan.scan], with_keys=with_keys) if reports else None
    )
    scanned_at = {shard: n for n, shard in enumerate(plan.scan)}
    parts = [(old, plan.reuse[i]) if i in plan.reuse else (scanned, scanned_at[i]) for i in range(len(urls))]
    return DatasetIndex.assemble(parts, old.location)


def update_index(
    spec: Any,
    folder: str,
    *,
    rebuild: bool = False,
    decode: bool = True,
    threads: int | None = None,
    with_keys: bool = True,
    **options: Any,
) -> IndexUpdate:
    """Indexes the shards of ``spec`` into the folder index at ``folder``: shards the index there
    already holds with the same content identity are kept as they are, new or changed ones are
    scanned (every shard with ``rebuild``), shards it holds that ``spec`` does not name are
    dropped. The result (in the order of ``spec``) is written there with :func:`write_index`: a
    new detail file for the scanned shards, the old ones kept, the manifest replaced last.
    Raises ShardError, writing nothing, when a shard to scan cannot be read."""
    source_options = options.pop("source_options", {})
    shards = expand_urls(spec, **source_options)
    urls = [index_name(s) for s in shards]
    old = None if rebuild else existing_index(folder)
    identities = probe_identities(shards, source_options=source_options)
    plan = plan_update(old, urls, identities)
    to_scan = [shards[i] for i in plan.scan]
    reports = _scan_for_index(
        to_scan, threads=threads, decode=decode, source_options=source_options, **options
    )
    with_identities(reports, [identities[i] for i in plan.scan])
    index = assemble_update(plan, old, urls, reports, with_keys=with_keys)
    write_index(index, folder)
    return IndexUpdate(index, len(plan.reuse), [urls[i] for i in plan.scan], plan.dropped, reports)


def write_index(index_or_reports: Any, path: str, *, urls: list[str] | None = None) -> str:
    """Writes an index where ``path`` says, atomically: a reader sees the old index or the new
    one, never a mix (detail files get new names, the manifest is replaced last).

    Args:
        index_or_reports: The index (from :func:`build_index`), or the scan reports to make one
            of.
        path: A folder (the default layout: ``manifest.bin``, which every rank loads, and a
            detail file fetched per shard), or a ``.json``/``.json.gz`` file name for the
            version-1 single-file layout (small datasets; not for subsets). Made if missing.
        urls: With scan reports: the shard names to record (default: the reports' own URLs).

    Returns:
        ``path``.

    Raises:
        ValueError: A subset index given a ``.json`` path.
        OSError: ``path`` cannot be written.
    """
    index = (
        index_or_reports
        if isinstance(index_or_reports, DatasetIndex)
        else index_from_reports(index_or_reports, urls)
    )
    if is_json_index_path(path):
        if index.is_subset:
            raise ValueError(f"{path}: a subset is written as a folder index (manifest + detail), not JSON")
        data = index.to_json()
        if path.lower().endswith(".gz"):
            import gzip

            data = gzip.compress(data, mtime=0)
        atomic_write(path, data)
        return path
    os.makedirs(path, exist_ok=True)
    detail_name = f"detail-{os.urandom(6).hex()}.bin"
    manifest, detail = index.to_layout(detail_name)
    if detail:
        atomic_write(os.path.join(path, detail_name), detail)
    atomic_write(os.path.join(path, MANIFEST_NAME), manifest)
    return path
