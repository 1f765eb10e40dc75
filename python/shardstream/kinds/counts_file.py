"""The one-off count files of the kinds planned over units (token counts, patch counts): JSON,
gzip when the name ends in ``.gz``, written atomically and checked for their format and version
when read."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any


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
