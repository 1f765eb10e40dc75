"""One agreed resume: which checkpoint every rank loads, and that every rank holds its bytes.

The ``latest`` pointer records the checkpoint's identity as one JSON line: its name, step and the
sha256 of its bytes, hashed while they were written. On resume rank 0 alone resolves ``latest``
(or the path or ``s3://`` URL given) and broadcasts that identity; every rank then hashes the file
it would load (from S3: the copy it downloaded, which is then the file it loads) and the ranks
agree on one verdict in a collective, so that ranks which see different files (a stale NFS cache,
a local disk per node) all stop with the same line instead of training with different weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from shardstream.errors import ShardError
from shardstream.train.dist import DistContext, all_gather, broadcast_json
from shardstream.train.storage import CheckpointStore, LocalStore, S3Store

POINTER = "latest"
DOWNLOAD_PREFIX = ".resume-rank"  # + rank + "-" + name: a download from a remote store
_HASH_CHUNK = 16 << 20
_NAME = re.compile(r"^step-(\d{8,})\.(?:pt|dcp)$")  # a file, or a sharded folder (train/fsdp.py)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def as_store(directory: str | os.PathLike[str] | CheckpointStore) -> CheckpointStore:
    return directory if isinstance(directory, CheckpointStore) else LocalStore(directory)


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_lines(path: str | os.PathLike[str]) -> list[str]:
    """The manifest of the files under ``path``: one line per file (relative path, size, sha256).
    Ranks that each hold part of a sharded checkpoint list their own files; the lines together
    give the folder's :func:`manifest_sha256`."""
    root = Path(path)
    return [
        f"{f.relative_to(root).as_posix()}\t{f.stat().st_size}\t{file_sha256(f)}\n"
        for f in root.rglob("*")
        if f.is_file()
    ]


def manifest_sha256(lines: list[str]) -> str:
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def folder_sha256(path: str | os.PathLike[str]) -> str:
    """A sharded checkpoint's identity: the sha256 of its manifest (:func:`manifest_lines`),
    sorted, so the same bytes in the same files give the same hash anywhere."""
    return manifest_sha256(manifest_lines(path))


def content_sha256(path: str | os.PathLike[str]) -> str:
    """The hash ``latest`` records: of the file, or of a sharded checkpoint folder's manifest."""
    return folder_sha256(path) if Path(path).is_dir() else file_sha256(path)


@dataclass(frozen=True)
class CheckpointIdentity:
    """Which checkpoint a run resumes: what rank 0 resolved, as every rank looks it up."""

    name: str  # an entry of the checkpoint store (in_directory), else the path or URL as given
    step: int | None  # None: not known before loading (a path whose name is not step-N.pt)
    sha256: str | None  # None: not recorded (an older pointer, or a path): rank 0 hashes the file
    in_directory: bool
    # the local file this rank verified and loads (a download, for S3); not part of the identity
    local: str | None = field(default=None, compare=False)

    def path_in(self, directory: str | os.PathLike[str]) -> Path:
        """The file this rank loads: in its own checkpoint folder, or the path given."""
        return Path(directory) / self.name if self.in_directory else Path(self.name)

    def describe(self) -> str:
        step = f"step {self.step}" if self.step is not None else "step unknown"
        return f"{self.name} ({step}, sha256 {(self.sha256 or '?')[:16]})"

    def pointer_line(self) -> bytes:
        record = {"name": self.name, "step": self.step, "sha256": self.sha256}
        return (json.dumps(record) + "\n").encode()


def step_of(name: str) -> int | None:
    m = _NAME.match(Path(name).name)
    return int(m.group(1)) if m else None


def checkpoint_steps(store: CheckpointStore) -> list[tuple[int, str]]:
    """(step, name) of the step checkpoints in the store, oldest first."""
    return sorted((int(m.group(1)), n) for n in store.names() if (m := _NAME.match(n)))


def _read_pointer(store: CheckpointStore) -> CheckpointIdentity | None:
    """The ``latest`` pointer: a JSON line, or (written before identities were recorded) the bare
    file name. None when absent or pointing at a file that is not there."""
    data = store.get_bytes(POINTER)
    if data is None:
        return None
    text = data.decode("utf-8").strip()
    if text.startswith("{"):
        record = json.loads(text)
        identity = CheckpointIdentity(
            str(record["name"]), record.get("step"), record.get("sha256"), in_directory=True
        )
    else:
        identity = CheckpointIdentity(text, step_of(text), None, in_directory=True)
    return identity if store.exists(identity.name) else None


def _entry(identity: CheckpointIdentity, store: CheckpointStore) -> tuple[CheckpointStore, str]:
    """The store and entry name that hold the checkpoint ``identity`` names."""
    if identity.in_directory:
        return store, identity.name
    if identity.name.startswith("s3://"):
        parent, _, name = identity.name.rpartition("/")
        staging = store.staging if isinstance(store, S3Store) else Path(".")
        return S3Store(parent, staging), name
    path = Path(identity.name)
    return LocalStore(path.parent), path.name


def resolve_identity(spec: str, directory: str | os.PathLike[str] | CheckpointStore) -> CheckpointIdentity:
    """What ``train.resume`` names, with its recorded hash where there is one (rank 0 calls it)."""
    store = as_store(directory)
    if spec == "latest":
        recorded = _read_pointer(store)
        if recorded is not None:
            return recorded
        candidates = checkpoint_steps(store)
        if not candidates:
            raise FileNotFoundError(f"train.resume latest: no checkpoint in {store.describe()}")
        name = candidates[-1][1]
        return CheckpointIdentity(name, step_of(name), None, in_directory=True)
    identity = CheckpointIdentity(spec, step_of(spec), None, in_directory=False)
    where, name = _entry(identity, store)
    if not where.exists(name):
        raise FileNotFoundError(f"train.resume: checkpoint file not found: {spec}")
    return identity


def resolve_checkpoint(spec: str, directory: str | os.PathLike[str]) -> Path:
    """A local checkpoint folder's ``'latest'`` (the pointer file, else the highest step present)
    or a file path."""
    if spec != "latest":
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"train.resume: checkpoint file not found: {path}")
        return path
    return resolve_identity(spec, directory).path_in(directory)


def fetch(identity: CheckpointIdentity, store: CheckpointStore, scratch: Path, rank: int) -> Path:
    """A local file (or, for a sharded checkpoint, folder) holding the checkpoint's bytes: the
    entry itself in a local store, else a download into ``scratch`` under this rank's own name
    (the caller deletes it after loading; a failed download leaves nothing)."""
    where, name = _entry(identity, store)
    local = where.local_path(name)
    if local is not None:
        if not local.exists():
            raise FileNotFoundError(str(local))
        return local
    scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / f"{DOWNLOAD_PREFIX}{rank}-{name}"
    folder = name.endswith(".dcp")
    try:
        if folder:  # into an empty folder: a leftover of an earlier attempt would change its hash
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            where.download_dir(name, target)
        else:
            where.get_file(name, target)
    except BaseException:
        discard_download(target)
        raise
    return target


def discard_download(path: Path) -> None:
    """Deletes what :func:`fetch` downloaded (a local store's own entry is left alone)."""
    if not path.name.startswith(DOWNLOAD_PREFIX):
        return
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class ResumeError(RuntimeError):
    """``train.resume`` cannot go ahead; raised on every rank with the same one-line message."""


_FOUND, _MISSING, _DIFFERENT, _UNREADABLE = 0, 1, 2, 3
_VERDICTS = {_MISSING: "no such file", _DIFFERENT: "different content", _UNREADABLE: "cannot read it"}


def agree_on_checkpoint(
    ctx: DistContext,
    spec: str,
    directory: str | os.PathLike[str] | CheckpointStore,
    *,
    scratch: str | os.PathLike[str] | None = None,
) -> CheckpointIdentity | None:
    """The checkpoint every rank resumes from (a collective: every rank calls it), or None when
    ``spec`` is ``latest`` and rank 0 has none yet (every rank then starts from scratch).

    Rank 0 resolves ``spec`` and broadcasts the identity; every rank (rank 0 too, against the
    hash recorded at save time) hashes the file it would load, fetched from S3 into ``scratch``
    where the store is remote; one all-gather of the verdicts follows. Unless every rank holds
    the same bytes, every rank raises the same ``ResumeError``. The identity returned carries in
    ``local`` the file this rank verified."""
    what = f"train.resume {spec}"
    store = as_store(directory)
    scratch_dir = Path(scratch) if scratch is not None else Path(".")
    local: Path | None = None
    if ctx.is_main:
        try:
            identity = resolve_identity(spec, store)
            if identity.sha256 is None:  # nothing recorded: rank 0's file is the reference
                local = fetch(identity, store, scratch_dir, ctx.rank)
                identity = replace(identity, sha256=content_sha256(local))
            choice: dict[str, Any] = {"identity": asdict(replace(identity, local=None))}
        except FileNotFoundError as e:
            choice = {"none": str(e)} if spec == "latest" else {"error": f"{what}: {e}"}
        except (OSError, ValueError, ShardError) as e:
            choice = {"error": f"{what}: cannot read the checkpoint on rank 0: {e}"}
    else:
        choice = {}
    choice = broadcast_json(ctx, choice)
    if "error" in choice:
        raise ResumeError(choice["error"])
    if "none" in choice:
        return None
    identity = CheckpointIdentity(**choice["identity"])
    try:
        local = local or fetch(identity, store, scratch_dir, ctx.rank)
        verdict = _FOUND if content_sha256(local) == identity.sha256 else _DIFFERENT
    except FileNotFoundError:
        verdict = _MISSING
    except (OSError, ShardError):
        verdict = _UNREADABLE
    verdicts = [int(v.item()) for v in all_gather(ctx, torch.tensor([verdict], dtype=torch.int64))]
    bad = [(rank, v) for rank, v in enumerate(verdicts) if v != _FOUND]
    if bad:
        ranks = "; ".join(f"rank {rank}: {_VERDICTS[v]}" for rank, v in bad)
        raise ResumeError(
            f"{what}: checkpoint {identity.describe()}, chosen by rank 0, is not the same on every rank "
            f"({ranks}); every rank must see the same checkpoint files (checkpoint.dir on storage that "
            "all nodes share, e.g. s3://)"
        )
    assert local is not None
    return replace(identity, local=str(local))
