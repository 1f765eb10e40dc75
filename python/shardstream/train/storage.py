"""Where checkpoints live: a local folder or an ``s3://bucket/prefix``, behind one small interface.

A store holds named entries: checkpoint files (``step-00000100.pt``), the ``latest`` pointer and
folders (a sharded checkpoint ``step-N.dcp/`` written by every rank). Publication is atomic in
both: a local file is written to a temporary name, flushed and renamed; an S3 object appears
whole when its upload completes. A checkpoint is published before the pointer that names it, so
a crash at any moment leaves the pointer naming a complete checkpoint.

S3 goes through the project's S3 stack (``shardstream.urls``): boto3's credential chain,
``AWS_ENDPOINT_URL``, retries, and errors translated to the typed ``SourceError`` family that
names the ``s3://`` URL (never a secret).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from shardstream._files import AtomicFile, atomic_write
from shardstream.errors import SourceError
from shardstream.urls import S3Options, _make_client, _s3_call, parse_s3_url


class CheckpointStore:
    """The interface both stores implement. ``name`` is one path segment (``step-N.pt``,
    ``latest``) or, for ``upload_dir``/``download_dir``, a folder name (``step-N.dcp``)."""

    url: str  # what messages show: the folder, or the s3:// prefix

    def describe(self, name: str = "") -> str:
        return f"{self.url.rstrip('/')}/{name}" if name else self.url

    def check(self) -> None:
        """Fails now (one line naming the store) if the store cannot be listed or written."""
        raise NotImplementedError

    def writer(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary file that is published as ``name`` when the block ends without an error
        (and leaves nothing behind otherwise)."""
        raise NotImplementedError

    def put_bytes(self, name: str, data: bytes) -> None:
        with self.writer(name) as f:
            f.write(data)

    def get_bytes(self, name: str) -> bytes | None:
        """The entry's bytes, None when it does not exist."""
        raise NotImplementedError

    def get_file(self, name: str, local: Path) -> None:
        """Copies the entry to the local file ``local`` (FileNotFoundError when missing)."""
        raise NotImplementedError

    def local_path(self, name: str) -> Path | None:
        """Where the entry can be read in place (a local store), else None."""
        return None

    def names(self) -> list[str]:
        """The entries at the top of the store (files and folders), sorted."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        return name in self.names()

    def delete(self, name: str) -> None:
        """Removes the entry (a file, or a folder and all it holds); absent is not an error."""
        raise NotImplementedError

    def upload_dir(self, local_dir: Path, name: str) -> None:
        """Publishes the files of ``local_dir`` (recursively) under the folder ``name``. Several
        ranks may call it for the same ``name`` with their own files."""
        raise NotImplementedError

    def download_dir(self, name: str, local_dir: Path) -> None:
        """Copies the folder ``name`` into ``local_dir``."""
        raise NotImplementedError


class LocalStore(CheckpointStore):
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.url = str(self.directory)

    def check(self) -> None:
        # created by the first write (a run without checkpoints leaves no folder)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"not a folder: {self.directory}")

    def writer(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return _local_writer(self.directory / name)

    def put_bytes(self, name: str, data: bytes) -> None:
        atomic_write(self.directory / name, data, fsync=True)

    def get_bytes(self, name: str) -> bytes | None:
        path = self.directory / name
        return path.read_bytes() if path.is_file() else None

    def get_file(self, name: str, local: Path) -> None:
        shutil.copyfile(self.directory / name, local)

    def local_path(self, name: str) -> Path | None:
        return self.directory / name

    def names(self) -> list[str]:
        return sorted(p.name for p in self.directory.iterdir()) if self.directory.is_dir() else []

    def exists(self, name: str) -> bool:
        return (self.directory / name).exists()

    def delete(self, name: str) -> None:
        path = self.directory / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def upload_dir(self, local_dir: Path, name: str) -> None:
        target = self.directory / name
        if Path(local_dir).resolve() == target.resolve():
            return  # written in place
        shutil.copytree(local_dir, target, dirs_exist_ok=True)

    def download_dir(self, name: str, local_dir: Path) -> None:
        source = self.directory / name
        if source.resolve() != Path(local_dir).resolve():
            shutil.copytree(source, local_dir, dirs_exist_ok=True)


@contextlib.contextmanager
def _local_writer(path: Path) -> Iterator[IO[bytes]]:
    with AtomicFile(path, fsync=True) as f:
        yield f.file  # type: ignore[misc]


class S3Store(CheckpointStore):
    """Entries are objects under ``prefix/``. A file is staged in ``staging`` (a local folder,
    under the run's output_dir) and uploaded whole: the object appears complete or not at all."""

    def __init__(self, url: str, staging: Path, s3: S3Options | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.bucket, prefix = parse_s3_url(self.url)
        self.prefix = prefix  # ends with "/" unless empty
        self.staging = Path(staging)
        self._s3 = s3 or S3Options()
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a boto3 client does not cross processes

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _make_client(self._s3, self.url)
        return self._client

    def _key(self, name: str) -> str:
        return self.prefix + name

    def check(self) -> None:
        _s3_call(self.url, self.client.list_objects_v2, Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

    @contextlib.contextmanager
    def writer(self, name: str) -> Iterator[IO[bytes]]:
        self.staging.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".upload", dir=self.staging)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
            self._upload(Path(tmp), self._key(name))
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _upload(self, path: Path, key: str) -> None:
        from boto3.exceptions import S3UploadFailedError

        where = f"s3://{self.bucket}/{key}"
        try:  # multipart for large files: the object appears when the last part is committed
            _s3_call(where, self.client.upload_file, str(path), self.bucket, key)
        except S3UploadFailedError as e:  # boto3's wrapper of the ClientError: its text names the code
            detail = str(e).rpartition(": An error occurred ")[2] or str(e)
            raise SourceError("unwritable", where, "", f"upload failed: {detail}") from None

    def put_bytes(self, name: str, data: bytes) -> None:
        key = self._key(name)
        _s3_call(f"s3://{self.bucket}/{key}", self.client.put_object, Bucket=self.bucket, Key=key, Body=data)

    def get_bytes(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        key = self._key(name)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise _s3_error(e, f"s3://{self.bucket}/{key}") from None
        return _s3_call(f"s3://{self.bucket}/{key}", response["Body"].read)

    def get_file(self, name: str, local: Path) -> None:
        from botocore.exceptions import ClientError

        key = self._key(name)
        try:
            self.client.download_file(self.bucket, key, str(local))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"no such checkpoint object: s3://{self.bucket}/{key}") from None
            raise _s3_error(e, f"s3://{self.bucket}/{key}") from None
        except Exception as e:
            raise _s3_error(e, f"s3://{self.bucket}/{key}") from None

    def _list(self, prefix: str, delimiter: bool) -> tuple[list[str], list[str]]:
        """(keys, common prefixes) under ``prefix``."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            params["Delimiter"] = "/"
        paginator = self.client.get_paginator("list_objects_v2")
        keys: list[str] = []
        folders: list[str] = []
        for page in _s3_call(self.url, lambda: list(paginator.paginate(**params))):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
            folders.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
        return keys, folders

    def names(self) -> list[str]:
        keys, folders = self._list(self.prefix, delimiter=True)
        found = {k[len(self.prefix) :] for k in keys} | {f[len(self.prefix) :].rstrip("/") for f in folders}
        return sorted(n for n in found if n)

    def delete(self, name: str) -> None:
        key = self._key(name)
        where = f"s3://{self.bucket}/{key}"
        _s3_call(where, self.client.delete_object, Bucket=self.bucket, Key=key)
        nested, _ = self._list(key + "/", delimiter=False)
        for start in range(0, len(nested), 1000):
            batch = [{"Key": k} for k in nested[start : start + 1000]]
            _s3_call(where, self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": batch})
        # servers that keep folders as entries (SeaweedFS's filer) list an emptied one until its
        # own marker goes, deepest first
        folders = {k[: i + 1] for k in nested for i in range(len(key), len(k)) if k[i] == "/"}
        for folder in sorted(folders, key=len, reverse=True):
            _s3_call(where, self.client.delete_object, Bucket=self.bucket, Key=folder)

    def upload_dir(self, local_dir: Path, name: str) -> None:
        root = Path(local_dir)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self._upload(path, self._key(f"{name}/{path.relative_to(root).as_posix()}"))

    def download_dir(self, name: str, local_dir: Path) -> None:
        prefix = self._key(name) + "/"
        keys, _ = self._list(prefix, delimiter=False)
        if not keys:
            raise FileNotFoundError(f"no such checkpoint folder: s3://{self.bucket}/{prefix}")
        for key in keys:
            target = Path(local_dir) / key[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            _s3_call(f"s3://{self.bucket}/{key}", self.client.download_file, self.bucket, key, str(target))


def _s3_error(error: Exception, where: str) -> Exception:
    from shardstream.urls import _translate

    return _translate(error, where)


def open_store(spec: str, output_dir: Path) -> CheckpointStore:
    """``checkpoint.dir``: empty (``output_dir/checkpoints``), a local folder, or an
    ``s3://bucket/prefix`` (files staged under ``output_dir`` while they upload)."""
    if not spec:
        return LocalStore(Path(output_dir) / "checkpoints")
    if spec.startswith("s3://"):
        return S3Store(spec, Path(output_dir) / ".checkpoint-staging")
    if "://" in spec:
        raise ValueError(
            f"checkpoint.dir: unsupported scheme in {spec!r} (a local folder or s3://BUCKET/PREFIX)"
        )
    return LocalStore(spec)


__all__ = ["CheckpointStore", "LocalStore", "S3Store", "open_store"]
