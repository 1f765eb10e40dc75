"""Writing a file so that readers see the old contents or the new, never a part: the one writer
behind index files, reports, checkpoints and shards.

The bytes go to a temporary file in the same folder (so the rename stays on one file system),
which is renamed over the target once complete. A failure removes the temporary file. The file
gets the permissions a plain ``open(path, "w")`` would give it (0666 less the umask).
"""

from __future__ import annotations

import json
import os
import secrets
from typing import IO, Any


class AtomicFile:
    """A binary file that becomes ``path`` on :meth:`commit` and vanishes on :meth:`discard`.

    With ``fsync``, ``commit`` makes the contents and the rename durable (the file, then its
    folder). Used as a context manager it commits when the block ends without an exception and
    discards otherwise; a writer that spans several calls keeps one open and calls either itself.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self._fsync = fsync
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        name = f".{os.path.basename(self.path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        self.tmp_path = os.path.join(directory, name)
        fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        self.file: IO[bytes] = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        try:
            self.file.flush()
            if self._fsync:
                os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp_path, self.path)
        except BaseException:
            self.discard()
            raise
        if self._fsync:
            _fsync_folder(os.path.dirname(os.path.abspath(self.path)))

    def discard(self) -> None:
        self.file.close()
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def atomic_write(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    with AtomicFile(path, fsync=fsync) as f:
        f.write(data)


def atomic_write_json(path: str | os.PathLike[str], value: Any) -> None:
    """``value`` as indented UTF-8 JSON and a final newline, written as :func:`atomic_write` does."""
    atomic_write(path, (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def _fsync_folder(directory: str) -> None:
    """A rename is durable only once the folder's entry is on disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
