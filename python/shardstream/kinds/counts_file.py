"""The one-off count files of the kinds planned over units (token counts, patch counts): JSON,
gzip when the name ends in ``.gz``, written atomically and checked for their format and version
when read; and what a count says about the units it could not read."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar

from shardstream.errors import OptionError, ShardError, UnreadableUnitsWarning, source_error_class
from shardstream.urls import redact

#: Failed units a warning lists one by one; the counts' ``failed`` list holds every one.
LISTED_FAILURES = 20

if TYPE_CHECKING:
    from typing_extensions import Self


class CountsFile:
    """What the counts of every kind planned over units share (:class:`~shardstream.TokenCounts`,
    :class:`~shardstream.PatchCounts`): saving and loading as a checked JSON file, and the
    identity a resume state records. A subclass (a dataclass with a ``units`` field) names its
    file's format and version, what it is called, its units' weight field and what else the
    identity covers."""

    FORMAT: ClassVar[str]
    VERSION: ClassVar[int]
    WHAT: ClassVar[str]
    WEIGHT: ClassVar[str]
    units: list[dict[str, Any]]

    @property
    def skipped(self) -> dict[str, int]:
        """What the count skipped, by reason (documents or samples: ``bad_utf8``,
        ``missing_text``, ``image_url_only``, ``corrupt_image``, ``too_few_patches``, ...)."""
        return self._skipped()

    def _padding(self, used: int, slots_key: str) -> float:
        """The fraction of the units' ``slots_key`` slots (summed) that ``used`` leaves padding."""
        slots = self._sum(slots_key)
        return 1 - used / slots if slots else 0.0

    def _sum(self, key: str) -> int:
        """The units' ``key`` (tokens, documents, batches...), summed."""
        return sum(int(u[key]) for u in self.units)

    def _skipped(self) -> dict[str, int]:
        """What the units skipped, by reason, summed."""
        total: Counter[str] = Counter()
        for u in self.units:
            total.update(u.get("skipped", {}))
        return dict(total)

    def _top_reason(self, what: str) -> str:
        """The most common reason nothing could be used, for a one-line error: the first failed
        file, else the most common skip with an example (units whose ``examples`` are (key,
        reason, detail) triples); ``what`` names the things skipped (``samples``)."""
        failed: list[dict[str, Any]] = getattr(self, "failed", [])
        if failed:
            f = failed[0]
            error = f["error"]
            return f"{error['reason']} in {len(failed)} files (e.g. {f['display']}: {error['detail']})"
        skipped = Counter(self._skipped())
        if not skipped:
            return f"the files hold no {what}"
        reason, n = skipped.most_common(1)[0]
        example = next(
            (f"{u['display']} {e[0]}: {e[2]}" for u in self.units for e in u["examples"] if e[1] == reason),
            None,
        )
        return f"{n} {what} {reason}" + (f" (e.g. {example})" if example else "")

    def _identity_head(self) -> bytes:
        """What the identity covers besides each unit's weight (the tokenizer, the budget)."""
        raise NotImplementedError

    def identity(self) -> str:
        """A short hash of the counts and what they were counted under (the tokenizer; the
        grids and budget): a resume state made over other counts is refused."""
        digest = hashlib.sha256(self._identity_head())
        for u in self.units:
            digest.update(f"{u['url']}|{u['first_row']}|{u[self.WEIGHT]}\n".encode())
        return digest.hexdigest()[:16]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the counts as JSON, atomically.

        Args:
            path: Where; gzip-compressed when it ends in ``.gz``.
        """
        save(path, self.FORMAT, self.VERSION, self.__dict__)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Reads counts written by :meth:`save`.

        Args:
            path: A file :meth:`save` wrote (plain or gzip JSON).

        Returns:
            The counts.

        Raises:
            ValueError: the file is not a counts file of this kind, of a version this package
                reads.
        """
        return cls(**load(path, cls.FORMAT, cls.VERSION, cls.WHAT))


class DocumentCounts(CountsFile):
    """Counts of a kind that reads documents (:class:`~shardstream.TokenCounts`,
    :class:`~shardstream.InterleavedCounts`): how many it counted."""

    @property
    def documents(self) -> int:
        """Documents counted (skipped ones not)."""
        return self._sum("documents")


class BatchCounts(CountsFile):
    """Counts of a kind whose units' weight is batches (:class:`~shardstream.InterleavedCounts`,
    :class:`~shardstream.PatchCounts`)."""

    WEIGHT: ClassVar[str] = "batches"

    @property
    def total_batches(self) -> int:
        """Batches of the whole corpus (under the counts' batch shape or patch budget)."""
        return self._sum("batches")


def save(path: str | os.PathLike[str], fmt: str, version: int, fields: dict[str, Any]) -> None:
    """Writes ``fields`` under ``format`` and ``version`` to ``path``, atomically.

    Args:
        path: Where; gzip-compressed when it ends in ``.gz``.
        fmt: The file's format name.
        version: Its version.
        fields: The counts' fields.
    """
    data = json.dumps({"format": fmt, "version": version, **fields}).encode()
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(gzip.compress(data) if path.endswith(".gz") else data)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str], fmt: str, version: int, what: str) -> dict[str, Any]:
    """The fields of a file :func:`save` wrote (plain or gzip JSON).

    Args:
        path: The file.
        fmt: The format it must have.
        version: The version it must have.
        what: What such a file is called in errors (``token counts``).

    Returns:
        Its fields, without ``format`` and ``version``.

    Raises:
        ValueError: the file is not such a file, or of another version.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path}: not a {what} file ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ValueError(f"{path}: not a {what} file (no format {fmt!r})")
    if data.get("version") != version:
        raise ValueError(f"{path}: {what} version {data.get('version')}, this package reads {version}")
    data.pop("format")
    data.pop("version")
    return data


def check_on_error(on_error: str) -> None:
    """Refuses an ``on_error`` other than ``"skip"`` or ``"raise"`` (as ``LoaderConfig`` does).

    Args:
        on_error: The value given.

    Raises:
        OptionError: another value.
    """
    if on_error not in ("skip", "raise"):
        raise OptionError("on_error", f"must be 'skip' or 'raise', got {on_error!r}")


def report_failed(
    caller: str, failed: list[dict[str, Any]], counted: int, on_error: str, *, stacklevel: int = 3
) -> None:
    """Says which units a count could not read, so that none is left out of the epochs unheard
    of: with ``on_error="raise"`` raises the first one's typed error; else warns
    (:class:`~shardstream.UnreadableUnitsWarning`) with a summary line, as ``shardstream index``
    words it, and one line per unit (URL redacted) with its reason.

    Args:
        caller: The counting function's name, first on the summary line.
        failed: The units that failed (``url``, ``display``, ``error``: reason, detail, kind).
        counted: The units counted.
        on_error: ``"skip"`` (warn) or ``"raise"``.
        stacklevel: The warning's, pointing at the user's call (3: the caller's caller).

    Raises:
        ShardError: with ``on_error="raise"``, for the first failed unit (a
            :class:`~shardstream.SourceError` subclass when it could not be fetched).
    """
    if not failed:
        return
    total = counted + len(failed)
    summary = f"{len(failed)} of {total} units could not be read"
    if on_error == "raise":
        first = failed[0]
        error = first["error"]
        reason = str(error.get("reason", "unreadable"))
        cls = source_error_class(str(error.get("kind", "other"))) if reason == "unreadable" else ShardError
        raise cls(reason, _where(first), "", f"{error.get('detail', '')} ({summary})")
    lines = [
        f"{caller}: {summary}: the counts leave them out, so no epoch reads them "
        "(on_error='raise' makes this an error)"
    ]
    for f in failed[:LISTED_FAILURES]:
        error = f["error"]
        lines.append(f"  cannot read {_where(f)}: {error.get('reason')}: {error.get('detail')}")
    if len(failed) > LISTED_FAILURES:
        more = len(failed) - LISTED_FAILURES
        lines.append(f"  ... and {more} more (the counts' failed list names them all)")
    warnings.warn(UnreadableUnitsWarning("\n".join(lines), failed), stacklevel=stacklevel)


def _where(failed: dict[str, Any]) -> str:
    """The failed unit's redacted name: the core's (a Parquet row group says its first row), else
    the file's."""
    return redact(str(failed["error"].get("url") or failed.get("display") or failed["url"]))
