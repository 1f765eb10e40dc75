"""Checkpoints: written atomically, read without unpickling arbitrary objects.

A checkpoint is one file ``checkpoints/step-00000100.pt`` holding the model, optimizer and
scheduler state, every rank's RNG states, the loader state and the position in the run. It is
written by rank 0 to a temporary file, flushed to disk and renamed into place, then the small
pointer file ``checkpoints/latest`` is replaced the same way: a crash at any moment leaves either
the previous checkpoint or the new one, never a torn file.

Everything in it is a tensor or a plain value (dict, list, str, int, float, bool); the loader
state and the config are stored as JSON text. Loading uses ``torch.load(weights_only=True)``,
which refuses anything else, so a checkpoint file cannot run code.

The ``latest`` pointer records the checkpoint's identity as one JSON line: its file name, step
and the sha256 of its bytes, hashed while they were written. On resume rank 0 alone resolves
``latest`` (or the path given) and broadcasts that identity; every rank then hashes the file it
would load and the ranks agree on one verdict in a collective, so that ranks which see different
files (a stale NFS cache, a local disk per node) all stop with the same line instead of training
with different weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardstream._files import AtomicFile, atomic_write
from shardstream.train.dist import DistContext, all_gather, broadcast_json

POINTER = "latest"
_HASH_CHUNK = 16 << 20

FORMAT = "shardstream-clip-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step-(\d{8,})\.(?:pt|dcp)$")  # a file, or a sharded folder (train/fsdp.py)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


# -- RNG states -----------------------------------------------------------------------------------


def rng_state() -> dict[str, torch.Tensor]:
    """This process's RNG states as fixed-shape tensors (so ranks can all-gather them)."""
    version, words, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    _, np_keys, np_pos, np_has_gauss, np_gauss = np_state
    state = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor([version, *words], dtype=torch.int64),
        "python_gauss": torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64),
        "numpy_keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "numpy_misc": torch.tensor([np_pos, np_has_gauss, np_gauss], dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    python = [int(v) for v in state["python"].tolist()]
    gauss = float(state["python_gauss"][0])
    random.setstate((python[0], tuple(python[1:]), None if np.isnan(gauss) else gauss))
    pos, has_gauss, np_gauss = state["numpy_misc"].tolist()
    np.random.set_state(
        ("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(pos), int(has_gauss), float(np_gauss))
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_rng_states(ctx: DistContext) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG states, in rank order (a collective: all ranks call it)."""
    local = rng_state()
    per_rank: list[dict[str, torch.Tensor]] = [{} for _ in range(ctx.world_size)]
    for key in sorted(local):
        for rank, tensor in enumerate(all_gather(ctx, local[key])):
            per_rank[rank][key] = tensor
    return per_rank


# -- files ----------------------------------------------------------------------------------------


@dataclass
class TrainingState:
    """Where a run stands: what a checkpoint restores besides the tensors."""

    step: int  # optimizer steps done
    epoch: int  # the epoch the next step belongs to
    step_in_epoch: int  # steps of that epoch already done (0: start it from the beginning)
    loader_state: dict[str, Any] | None  # the loader's state_dict() after those steps


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    ctx: DistContext,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainingState,
    config: dict[str, Any],
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """Writes the checkpoint for ``state.step`` (a collective: every rank calls it; rank 0 writes).
    ``extra``: more entries of plain values (fp16's loss scaler state). Returns its path on rank
    0, None elsewhere."""
    rng = gather_rng_states(ctx)
    if not ctx.is_main:
        return None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": state.step,
        "epoch": state.epoch,
        "step_in_epoch": state.step_in_epoch,
        "world_size": ctx.world_size,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng,
        "loader_json": json.dumps(state.loader_state) if state.loader_state is not None else "",
        "config_json": json.dumps(config),
        "torch_version": str(torch.__version__),
        **(extra or {}),
    }
    path = directory / checkpoint_name(state.step)
    with AtomicFile(path, fsync=True) as f:
        hashing = _HashingWriter(f.file)
        torch.save(payload, hashing)
    identity = CheckpointIdentity(path.name, state.step, hashing.hexdigest(), in_directory=True)
    atomic_write(directory / POINTER, identity.pointer_line(), fsync=True)
    _prune(directory, keep, protect=path)
    return path


class _HashingWriter:
    """A write-only file that hashes what passes through it (torch.save needs write and flush)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._sha256 = hashlib.sha256()

    def write(self, data: Any) -> int:
        self._sha256.update(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_sha256(path: str | os.PathLike[str]) -> str:
    """A sharded checkpoint's identity: the sha256 of its manifest, one line per file (relative
    path, size, sha256), sorted, so the same bytes in the same files give the same hash anywhere."""
    root = Path(path)
    lines = sorted(
        f"{f.relative_to(root).as_posix()}\t{f.stat().st_size}\t{file_sha256(f)}\n"
        for f in root.rglob("*")
        if f.is_file()
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def content_sha256(path: str | os.PathLike[str]) -> str:
    """The hash ``latest`` records: of the file, or of a sharded checkpoint folder's manifest."""
    return folder_sha256(path) if Path(path).is_dir() else file_sha256(path)


def _prune(directory: Path, keep: int, protect: Path) -> None:
    if keep <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))
    for _, old in steps[:-keep]:
        if old != protect:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)


@dataclass(frozen=True)
class CheckpointIdentity:
    """Which checkpoint a run resumes: what rank 0 resolved, as every rank looks it up."""

    name: str  # a file name in the checkpoint folder (in_directory), else the path as given
    step: int | None  # None: not known before loading (a path whose name is not step-N.pt)
    sha256: str | None  # None: not recorded (an older pointer, or a path): rank 0 hashes the file
    in_directory: bool

    def path_in(self, directory: str | os.PathLike[str]) -> Path:
        """The file this rank loads: in its own checkpoint folder, or the path given."""
        return Path(directory) / self.name if self.in_directory else Path(self.name)

    def describe(self) -> str:
        step = f"step {self.step}" if self.step is not None else "step unknown"
        return f"{self.name} ({step}, sha256 {(self.sha256 or '?')[:16]})"

    def pointer_line(self) -> bytes:
        record = {"name": self.name, "step": self.step, "sha256": self.sha256}
        return (json.dumps(record) + "\n").encode()


def _step_of(name: str) -> int | None:
    m = _NAME.match(Path(name).name)
    return int(m.group(1)) if m else None


def _read_pointer(directory: Path) -> CheckpointIdentity | None:
    """The ``latest`` pointer: a JSON line, or (written before identities were recorded) the bare
    file name. None when absent or pointing at a file that is not there."""
    pointer = directory / POINTER
    if not pointer.is_file():
        return None
    text = pointer.read_text(encoding="utf-8").strip()
    if text.startswith("{"):
        record = json.loads(text)
        identity = CheckpointIdentity(
            str(record["name"]), record.get("step"), record.get("sha256"), in_directory=True
        )
    else:
        identity = CheckpointIdentity(text, _step_of(text), None, in_directory=True)
    return identity if identity.path_in(directory).exists() else None


def resolve_identity(spec: str, directory: str | os.PathLike[str]) -> CheckpointIdentity:
    """What ``train.resume`` names, with its recorded hash where there is one (rank 0 calls it)."""
    directory = Path(directory)
    if spec == "latest":
        recorded = _read_pointer(directory)
        if recorded is not None:
            return recorded
    path = resolve_checkpoint(spec, directory)
    in_directory = spec == "latest"
    return CheckpointIdentity(
        path.name if in_directory else str(path), _step_of(path.name), None, in_directory=in_directory
    )


def resolve_checkpoint(spec: str, directory: str | os.PathLike[str]) -> Path:
    """``'latest'`` (the pointer file, else the highest step present) or a file path."""
    directory = Path(directory)
    if spec != "latest":
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"train.resume: checkpoint file not found: {path}")
        return path
    recorded = _read_pointer(directory)
    if recorded is not None:
        return recorded.path_in(directory)
    candidates = (
        sorted((int(m.group(1)), p) for p in directory.glob("step-*") if (m := _NAME.match(p.name)))
        if directory.is_dir()
        else []
    )
    if not candidates:
        raise FileNotFoundError(f"train.resume latest: no checkpoint in {directory}")
    return candidates[-1][1]


class ResumeError(RuntimeError):
    """``train.resume`` cannot go ahead; raised on every rank with the same one-line message."""


_FOUND, _MISSING, _DIFFERENT, _UNREADABLE = 0, 1, 2, 3
_VERDICTS = {_MISSING: "no such file", _DIFFERENT: "different content", _UNREADABLE: "cannot read it"}


def agree_on_checkpoint(
    ctx: DistContext, spec: str, directory: str | os.PathLike[str]
) -> CheckpointIdentity | None:
    """The checkpoint every rank resumes from (a collective: every rank calls it), or None when
    ``spec`` is ``latest`` and rank 0 has none yet (every rank then starts from scratch).

    Rank 0 resolves ``spec`` and broadcasts the identity; every rank (rank 0 too, against the
    hash recorded at save time) hashes the file it would load; one all-gather of the verdicts
    follows. Unless every rank holds the same bytes, every rank raises the same ``ResumeError``."""
    what = f"train.resume {spec}"
    if ctx.is_main:
        try:
            identity = resolve_identity(spec, directory)
            if identity.sha256 is None:  # nothing recorded: rank 0's file is the reference
                identity = replace(identity, sha256=content_sha256(identity.path_in(directory)))
            choice: dict[str, Any] = {"identity": asdict(identity)}
        except FileNotFoundError as e:
            choice = {"none": str(e)} if spec == "latest" else {"error": f"{what}: {e}"}
        except (OSError, ValueError) as e:
            choice = {"error": f"{what}: cannot read the checkpoint on rank 0: {e}"}
    else:
        choice = {}
    choice = broadcast_json(ctx, choice)
    if "error" in choice:
        raise ResumeError(choice["error"])
    if "none" in choice:
        return None
    identity = CheckpointIdentity(**choice["identity"])
    path = identity.path_in(directory)
    if not path.exists():
        verdict = _MISSING
    else:
        try:
            verdict = _FOUND if content_sha256(path) == identity.sha256 else _DIFFERENT
        except OSError:
            verdict = _UNREADABLE
    verdicts = [int(v.item()) for v in all_gather(ctx, torch.tensor([verdict], dtype=torch.int64))]
    bad = [(rank, v) for rank, v in enumerate(verdicts) if v != _FOUND]
    if bad:
        ranks = "; ".join(f"rank {rank}: {_VERDICTS[v]}" for rank, v in bad)
        raise ResumeError(
            f"{what}: checkpoint {identity.describe()}, chosen by rank 0, is not the same on every rank "
            f"({ranks}); every rank must see the same checkpoint files (train.output_dir on storage that "
            "all nodes share)"
        )
    return identity


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's contents. ``weights_only=True``: tensors and plain values only."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError ... for bad files
        text = str(e)
        refused = re.search(r"Unsupported global: GLOBAL \S+", text)
        reason = (
            f"it holds a non-tensor object ({refused.group(0)})" if refused else text.strip().splitlines()[0]
        )
        raise ValueError(f"cannot load checkpoint {path}: {type(e).__name__}: {reason}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a shardstream CLIP checkpoint")
    if payload.get("version", 0) > VERSION:
        raise ValueError(
            f"{path} has checkpoint format version {payload['version']}, newer than this code ({VERSION})"
        )
    return payload


def training_state(payload: dict[str, Any]) -> TrainingState:
    loader_json = payload.get("loader_json") or ""
    return TrainingState(
        step=int(payload["step"]),
        epoch=int(payload["epoch"]),
        step_in_epoch=int(payload["step_in_epoch"]),
        loader_state=json.loads(loader_json) if loader_json else None,
    )
