"""Deterministic, atomic WebDataset shard writing.

The same samples in the same order always give byte-identical shards: every tar header has fixed
mtime, uid, gid, owner and mode, members of a sample are written in sorted extension order, and no
PAX timestamp records are emitted (a PAX ``path`` record appears only for names a ustar header
cannot hold). Each shard is written to a temporary file next to its destination and renamed into
place when complete, so a crash never leaves a half-written shard under the final name.

``write_from_folder`` and ``write_from_table`` build shards from a folder of image + caption files
or from a CSV/Parquet table; both are used by ``shardstream write``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shardstream._deps import require
from shardstream._files import AtomicFile
from shardstream._system import available_cores

IMAGE_EXTS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")

_BLOCK = 512
# Fixed header fields: reproducible shards must not depend on who wrote them or when.
_MTIME = 0
_MODE = 0o644

SampleValue = bytes | bytearray | memoryview | str


class ShardWriter:
    """Writes samples into numbered WebDataset tar shards, deterministically and atomically.

    The same samples in the same order always give byte-identical shards, and each shard appears
    under its name only when complete. A shard never exceeds ``max_size`` unless one sample alone
    is larger; that sample then gets a shard of its own. As a context manager it closes on
    success and drops the unfinished shard on an exception.

    Example:
        >>> with ShardWriter("out/shard-%06d.tar", max_count=1000) as writer:  # doctest: +SKIP
        ...     writer.write({"__key__": "000001", "jpg": jpeg_bytes, "txt": "a red bicycle"})

    Args:
        pattern: Local path of the shards with their number: ``"out/shard-%06d.tar"`` or
            ``"out/shard-{shard:06d}.tar"``; folders are made. Remote URLs are refused.
        max_count: Samples per shard at most (default 10000). Must be >= 1.
        max_size: Bytes per shard at most (default 1 GiB), tar headers included. Must be >= 1536.
        start_shard: The number of the first shard (default 0), e.g. to append to a dataset.
        fsync: Flush each shard to disk before renaming it into place (default True); False is
            faster and safe against a crash of this process, not of the machine.

    Raises:
        ValueError: A bad ``pattern``, ``max_count`` or ``max_size``.

    Attributes:
        samples_written: Samples written so far.
        bytes_written: Bytes of the finished shards.
    """

    def __init__(
        self,
        pattern: str,
        *,
        max_count: int = 10000,
        max_size: int = 1 << 30,
        start_shard: int = 0,
        fsync: bool = True,
    ) -> None:
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        if max_size < 3 * _BLOCK:
            raise ValueError(f"max_size must be >= {3 * _BLOCK} bytes, got {max_size}")
        if "://" in pattern and not pattern.startswith("file://"):
            raise ValueError(f"shards can only be written to local paths, got {pattern!r}")
        self._pattern = pattern.removeprefix("file://")
        _check_pattern(self._pattern)
        self.max_count = max_count
        self.max_size = max_size
        self._fsync = fsync
        self._next_shard = start_shard
        self._shards: list[str] = []
        self._file: AtomicFile | None = None
        self._final_path = ""
        self._count = 0
        self._size = 0
        self._keys: set[str] = set()
        self._closed = False
        self.samples_written = 0
        self.bytes_written = 0

    # -- context manager -------------------------------------------------------------------------
    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- public API --------------------------------------------------------------------------------
    @property
    def shards(self) -> list[str]:
        """Paths of the shards finished so far (renamed into place)."""
        return list(self._shards)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Appends one sample, starting a new shard first when this one is full.

        Args:
            sample: ``"__key__"`` (a str with no ``.`` in its last path component, not absolute,
                no ``..``) and extension -> ``bytes`` or ``str`` (UTF-8), e.g. ``{"__key__": "k1",
                "jpg": b"...", "txt": "caption"}``; members are written in sorted extension
                order. Other ``"__"`` entries (``__url__``...) are ignored, as webdataset does.

        Raises:
            ValueError: The writer is closed, the key is missing, invalid or already in this
                shard, or a value is neither bytes nor str.
        """
        if self._closed:
            raise ValueError("write() on a closed ShardWriter")
        key, members = _encode_sample(sample)
        encoded = b"".join(_member_bytes(f"{key}.{ext}", data) for ext, data in members)
        if self._file is not None and (
            self._count >= self.max_count or self._size + len(encoded) + 2 * _BLOCK > self.max_size
        ):
            self._finish_shard()
        if self._file is None:
            self._open_shard()
        if key in self._keys:
            raise ValueError(f"duplicate key {key!r} in shard {self._final_path}")
        self._keys.add(key)
        assert self._file is not None
        self._file.write(encoded)
        self._count += 1
        self._size += len(encoded)
        self.samples_written += 1

    def close(self) -> list[str]:
        """Finishes the current shard (idempotent).

        Returns:
            The paths of all shards written, in order.
        """
        if not self._closed:
            self._closed = True
            if self._file is not None:
                self._finish_shard()
        return self.shards

    def abort(self) -> None:
        """Drops the shard being written (finished shards stay); used when the input fails."""
        self._closed = True
        if self._file is not None:
            self._file.discard()
            self._file = None

    # -- shard files -------------------------------------------------------------------------------
    def _open_shard(self) -> None:
        self._final_path = _shard_path(self._pattern, self._next_shard)
        self._next_shard += 1
        self._file = AtomicFile(self._final_path, fsync=self._fsync)
        self._count = 0
        self._size = 0
        self._keys = set()

    def _finish_shard(self) -> None:
        assert self._file is not None
        self._file.write(b"\0" * (2 * _BLOCK))  # end-of-archive marker
        self._size += 2 * _BLOCK
        self._file.commit()
        self._file = None
        self._shards.append(self._final_path)
        self.bytes_written += self._size


def _check_pattern(pattern: str) -> None:
    try:
        first, second = _shard_path(pattern, 0), _shard_path(pattern, 1)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise ValueError(
            f"bad shard pattern {pattern!r}: use %06d or {{shard:06d}} for the shard number ({e})"
        ) from None
    if first == second:
        raise ValueError(
            f"shard pattern {pattern!r} has no shard number: use %06d or {{shard:06d}}, "
            "e.g. out/shard-%06d.tar"
        )


def _shard_path(pattern: str, number: int) -> str:
    if "{" in pattern:
        return pattern.format(shard=number)
    if "%" in pattern:
        return pattern % number
    return pattern


def _encode_sample(sample: Mapping[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
    key = sample.get("__key__")
    if not isinstance(key, str):
        raise ValueError(f"sample needs a str '__key__', got {key!r}")
    _check_key(key)
    members: list[tuple[str, bytes]] = []
    for ext in sorted(sample):
        if ext.startswith("__"):
            continue
        if not ext or "/" in ext or "\0" in ext:
            raise ValueError(f"bad extension {ext!r} in sample {key!r}")
        value = sample[ext]
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
        else:
            raise TypeError(
                f"sample {key!r} member {ext!r}: value must be bytes or str, got {type(value).__name__}"
            )
        members.append((ext, data))
    if not members:
        raise ValueError(f"sample {key!r} has no members")
    return key, members


def _check_key(key: str) -> None:
    """A key must read back as the same key under webdataset's grouping rule (the member path up
    to the first '.' of its last component) and must not look like a path outside the shard."""
    last = key.rsplit("/", 1)[-1]
    problem = ""
    if not last:
        problem = "is empty or ends with '/'"
    elif "." in last:
        problem = "has a '.' in its last path component (readers would split the key there)"
    elif "\0" in key:
        problem = "contains a NUL byte"
    elif key.startswith("/") or ".." in key.split("/"):
        problem = "is an absolute path or contains '..'"
    if problem:
        raise ValueError(f"bad sample key {key!r}: it {problem}")


def _member_bytes(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = _MTIME
    info.mode = _MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    padding = -len(data) % _BLOCK
    return header + data + b"\0" * padding


# -- building shards from folders and tables ---------------------------------------------------------


@dataclass
class WriteResult:
    """What ``write_from_folder``/``write_from_table`` produced and what they left out, with why."""

    shards: list[str] = field(default_factory=list)
    samples: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (input name, reason)
    ignored_files: int = 0  # files in the folder that belong to no sample (e.g. README)


@dataclass
class _Skip:
    """An input left out, with why; travels in input order with the candidates."""

    key: str
    reason: str


@dataclass
class _Candidate:
    """One sample before its image is (optionally) resized: where it came from and its members."""

    key: str
    origin: str
    image_ext: str
    image: bytes | str  # bytes, or a path to read
    other: dict[str, bytes] = field(default_factory=dict)


def write_from_folder(
    source: str,
    pattern: str,
    *,
    max_count: int = 10000,
    max_size: int = 1 << 30,
    resize: int | None = None,
    quality: int = 95,
    caption_ext: str = "txt",
    require_caption: bool = True,
    image_exts: Iterable[str] = IMAGE_EXTS,
    threads: int | None = None,
    on_sample: Callable[[int], None] | None = None,
) -> WriteResult:
    """Shards from a folder tree of ``NAME.<image>`` + ``NAME.<caption_ext>`` (+ optional
    ``NAME.json``) files, in sorted path order. The key is the path relative to ``source``
    without its extension, with '.' in the file stem replaced by '_' (webdataset splits keys at
    the first dot). Images without a caption are skipped and reported."""
    if not os.path.isdir(source):
        raise FileNotFoundError(f"source folder not found: {source}")
    image_exts = tuple(e.lower() for e in image_exts)
    groups: dict[str, dict[str, str]] = {}
    origins: dict[str, str] = {}
    result = WriteResult()
    for directory, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel_dir = os.path.relpath(directory, source).replace(os.sep, "/")
        for name in sorted(filenames):
            if name.startswith(".") or "." not in name:
                result.ignored_files += int(not name.startswith("."))
                continue
            stem, ext = name.rsplit(".", 1)
            rel_stem = stem if rel_dir == "." else f"{rel_dir}/{stem}"
            key_stem = stem.replace(".", "_")
            key = key_stem if rel_dir == "." else f"{rel_dir}/{key_stem}"
            previous = origins.setdefault(key, rel_stem)
            if previous != rel_stem:
                raise ValueError(
                    f"files {previous!r}.* and {rel_stem!r}.* map to the same key {key!r} "
                    "(dots in file names become '_'): rename one of them"
                )
            members = groups.setdefault(key, {})
            if ext.lower() in members:
                raise ValueError(f"{members[ext.lower()]!r} and {name!r} differ only in case: rename one")
            members[ext.lower()] = os.path.join(directory, name)

    def candidates() -> Iterator[_Candidate | _Skip]:
        for key in sorted(groups):
            files = groups[key]
            images = [ext for ext in files if ext in image_exts]
            texts = [ext for ext in files if ext in (caption_ext, "json")]
            result.ignored_files += len(files) - len(images) - len(texts)
            if not images:
                if texts:  # a caption without its image is worth reporting; a stray README is not
                    yield _Skip(key, "no image file (" + ", ".join(sorted(files)) + ")")
                continue
            if len(images) > 1:
                yield _Skip(key, "several images: " + ", ".join(sorted(images)))
                continue
            if caption_ext not in files and require_caption:
                yield _Skip(key, f"no .{caption_ext} caption")
                continue
            other = {}
            for ext in (caption_ext, "json"):
                if ext in files:
                    with open(files[ext], "rb") as f:
                        other[ext] = f.read()
            yield _Candidate(key, files[images[0]], images[0], files[images[0]], other)

    _write_candidates(candidates(), pattern, result, max_count, max_size, resize, quality, threads, on_sample)
    return result


def write_from_table(
    table: str,
    pattern: str,
    *,
    image_col: str = "image",
    caption_col: str = "caption",
    key_col: str | None = None,
    json_cols: Iterable[str] = (),
    base_dir: str | None = None,
    caption_ext: str = "txt",
    require_caption: bool = True,
    max_count: int = 10000,
    max_size: int = 1 << 30,
    resize: int | None = None,
    quality: int = 95,
    threads: int | None = None,
    on_sample: Callable[[int], None] | None = None,
) -> WriteResult:
    """Shards from a CSV or Parquet table with an image column (a path, relative to ``base_dir``
    or to the table's folder, or the image bytes) and a caption column, in row order. Keys come
    from ``key_col`` or are the zero-padded row number. ``json_cols`` go into a ``.json`` member."""
    json_cols = list(json_cols)
    base = base_dir if base_dir is not None else os.path.dirname(os.path.abspath(table))
    rows = _read_table(table, [c for c in [image_col, caption_col, key_col, *json_cols] if c])
    result = WriteResult()

    def candidates() -> Iterator[_Candidate | _Skip]:
        for number, row in enumerate(rows):
            key = str(row[key_col]) if key_col else f"{number:09d}"
            _check_key(key)
            image = row[image_col]
            caption = row[caption_col]
            if image is None or image == "":
                yield _Skip(key, f"row {number}: empty {image_col!r}")
                continue
            if caption is None and require_caption:
                yield _Skip(key, f"row {number}: empty {caption_col!r}")
                continue
            if isinstance(image, bytes | bytearray):
                ext = _sniff_image_ext(bytes(image))
                if ext is None:
                    yield _Skip(key, f"row {number}: {image_col!r} bytes are not an image")
                    continue
                origin = f"row {number}"
            else:
                path = os.path.join(base, str(image))
                ext = os.path.splitext(path)[1].lstrip(".").lower()
                if ext not in IMAGE_EXTS:
                    yield _Skip(key, f"row {number}: {image!s} is not a jpg/png/webp file")
                    continue
                if not os.path.isfile(path):
                    yield _Skip(key, f"row {number}: image file not found: {path}")
                    continue
                image = path
                origin = path
            other: dict[str, bytes] = {}
            if caption is not None:
                other[caption_ext] = str(caption).encode("utf-8")
            if json_cols:
                meta = {c: row[c] for c in json_cols}
                other["json"] = json.dumps(meta, sort_keys=True, ensure_ascii=False, default=str).encode()
            yield _Candidate(key, origin, ext, image, other)

    _write_candidates(candidates(), pattern, result, max_count, max_size, resize, quality, threads, on_sample)
    return result


def _read_table(path: str, columns: list[str]) -> Iterator[dict[str, Any]]:
    """Rows as dicts of the requested columns, streamed (Parquet by record batch)."""
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):
        pq = require("pyarrow.parquet", "reading a Parquet table")
        parquet = pq.ParquetFile(path)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; columns are {parquet.schema_arrow.names}")
        return (row for batch in parquet.iter_batches(columns=columns) for row in batch.to_pylist())
    if lower.endswith((".csv", ".tsv")):
        return _read_csv(path, columns, "\t" if lower.endswith(".tsv") else ",")
    raise ValueError(f"{path}: table must be .csv, .tsv or .parquet")


def _read_csv(path: str, columns: list[str], delimiter: str) -> Iterator[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; columns are {reader.fieldnames}")
        yield from reader


def _sniff_image_ext(data: bytes) -> str | None:
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _write_candidates(
    candidates: Iterator[_Candidate | _Skip],
    pattern: str,
    result: WriteResult,
    max_count: int,
    max_size: int,
    resize: int | None,
    quality: int,
    threads: int | None,
    on_sample: Callable[[int], None] | None,
) -> None:
    def prepare(candidate: _Candidate | _Skip) -> tuple[str, dict[str, Any] | None, str]:
        if isinstance(candidate, _Skip):
            return candidate.key, None, candidate.reason
        try:
            data = candidate.image
            if isinstance(data, str):
                with open(data, "rb") as f:
                    data = f.read()
            ext = candidate.image_ext
            if resize:
                data, ext = resize_shorter_side(data, resize, quality=quality, ext=ext)
        except (OSError, ValueError) as e:  # PIL raises OSError subclasses for undecodable images
            return candidate.key, None, f"cannot read or resize image: {e}"
        return candidate.key, {"__key__": candidate.key, ext: data, **candidate.other}, ""

    with ShardWriter(pattern, max_count=max_count, max_size=max_size) as writer:
        for key, sample, problem in _ordered_map(prepare, candidates, threads):
            if sample is None:
                result.skipped.append((key, problem))
                continue
            writer.write(sample)
            if on_sample is not None:
                on_sample(writer.samples_written)
    result.shards = writer.shards
    result.samples = writer.samples_written
    result.bytes = writer.bytes_written


def _ordered_map(fn: Callable[[Any], Any], items: Iterator[Any], threads: int | None) -> Iterator[Any]:
    """``map`` on a thread pool that keeps input order and holds at most a few items per thread in
    memory (Pillow releases the GIL while decoding, resizing and encoding)."""
    threads = threads or available_cores()
    if threads <= 1:
        yield from map(fn, items)
        return
    window = 4 * threads
    with ThreadPoolExecutor(threads, thread_name_prefix="shardstream-write") as pool:
        pending = []
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


def resize_shorter_side(data: bytes, size: int, *, quality: int = 95, ext: str = "jpg") -> tuple[bytes, str]:
    """Re-encodes an image as JPEG with its shorter side ``size`` pixels (EXIF orientation
    applied, since the re-encoded file carries no EXIF). Images already small enough are returned
    unchanged, never upscaled. Returns (bytes, extension)."""
    Image = require("PIL.Image", "resizing images (--resize)")
    ImageOps = require("PIL.ImageOps", "resizing images (--resize)")

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        if min(width, height) <= size:
            return data, ext
        scale = size / min(width, height)
        target = (max(1, round(width * scale)), max(1, round(height * scale)))
        if image.format == "JPEG":
            image.draft("RGB", target)  # let the JPEG decoder downscale in the DCT first
        image = ImageOps.exif_transpose(image)
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        # exif_transpose may have swapped the sides
        width, height = image.size
        scale = size / min(width, height)
        target = (max(1, round(width * scale)), max(1, round(height * scale)))
        resized = image.resize(target, Image.Resampling.LANCZOS)
        out = io.BytesIO()
        resized.save(out, format="JPEG", quality=quality, optimize=False, progressive=False)
        return out.getvalue(), "jpg"
