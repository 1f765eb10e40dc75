"""Checkpoints: snapshotted at a step boundary, written atomically, read without unpickling.

A checkpoint is one file ``step-00000100.pt`` holding the model, optimizer and scheduler state,
every rank's RNG states, the loader state and the position in the run, in the checkpoint store
(``checkpoint.dir``: a local folder, by default ``output_dir/checkpoints``, or an
``s3://bucket/prefix``; see ``storage.py``). Saving has two halves: :func:`snapshot_checkpoint`
(a collective at the step boundary: the RNG and loader states are gathered, and rank 0 copies
every tensor to host memory) and :func:`write_checkpoint` (serialise, hash, publish, then the
``latest`` pointer, then pruning), which the trainer runs on a background thread
(``checkpoint_async.py``) so that training goes on while it writes. The checkpoint is published
before the pointer that names it, each atomically: a crash at any moment leaves either the
previous checkpoint or the new one, never a torn file.

Everything in it is a tensor or a plain value (dict, list, str, int, float, bool); the loader
state and the config are stored as JSON text. Loading uses ``torch.load(weights_only=True)``,
which refuses anything else, so a checkpoint file cannot run code. Which checkpoint a resume
loads is agreed by every rank (``checkpoint_resume.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardstream.train.checkpoint_resume import (
    POINTER,
    CheckpointIdentity,
    ResumeError,
    agree_on_checkpoint,
    as_store,
    checkpoint_name,
    checkpoint_steps,
    content_sha256,
    discard_download,
    fetch,
    file_sha256,
    folder_sha256,
    manifest_lines,
    manifest_sha256,
    resolve_checkpoint,
    resolve_identity,
)
from shardstream.train.dist import DistContext, all_gather
from shardstream.train.storage import CheckpointStore

FORMAT = "shardstream-clip-checkpoint"
VERSION = 1


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


def host_copy(value: Any, reuse: Any = None) -> Any:
    """``value`` with every tensor copied to host memory (the originals go on changing in place
    as training continues); containers rebuilt, plain values kept. ``reuse``: an earlier copy of
    the same structure whose tensors (same shape and dtype) are overwritten instead of allocated:
    filling fresh pages costs more than the copy itself."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.device.type == "cpu"
            and reuse.shape == tensor.shape
            and reuse.dtype == tensor.dtype
            and reuse.data_ptr() != tensor.data_ptr()
        ):
            return reuse.copy_(tensor)
        return tensor.clone() if tensor.device.type == "cpu" else tensor.to("cpu")
    if isinstance(value, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: host_copy(v, old.get(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        return type(value)(host_copy(v, o) for v, o in zip(value, old, strict=True))
    return value


def snapshot_checkpoint(
    *,
    ctx: DistContext,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainingState,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
    reuse: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The checkpoint of ``state.step`` as a payload in host memory (a collective: every rank
    calls it, for the RNG states; rank 0 gets the payload, the others None). ``extra``: more
    entries of plain values (fp16's loss scaler state). ``reuse``: the previous payload, whose
    write has completed: its tensors are overwritten (see :func:`host_copy`)."""
    old = reuse or {}
    rng = gather_rng_states(ctx)
    if not ctx.is_main:
        return None
    return {
        **run_entries(ctx, state, config, rng),
        "model": host_copy(model.state_dict(), old.get("model")),
        "optimizer": host_copy(optimizer.state_dict(), old.get("optimizer")),
        "scheduler": host_copy(scheduler.state_dict(), old.get("scheduler")),
        **host_copy(extra or {}),
    }


def run_entries(
    ctx: DistContext, state: TrainingState, config: dict[str, Any], rng: list[dict[str, torch.Tensor]]
) -> dict[str, Any]:
    """What every checkpoint holds besides the weights and optimizer state (a file's and a
    sharded folder's ``trainer.pt`` alike): format, position in the run, RNG, loader, config."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "step": state.step,
        "epoch": state.epoch,
        "step_in_epoch": state.step_in_epoch,
        "world_size": ctx.world_size,
        "rng": rng,
        "loader_json": json.dumps(state.loader_state) if state.loader_state is not None else "",
        "config_json": json.dumps(config),
        "torch_version": str(torch.__version__),
    }


def write_checkpoint(store: CheckpointStore, payload: dict[str, Any], keep: int) -> CheckpointIdentity:
    """Publishes ``payload`` as ``step-N.pt``, then the ``latest`` pointer naming it with its
    sha256 (hashed as the bytes are written), then deletes all but the ``keep`` newest."""
    name = checkpoint_name(int(payload["step"]))
    with store.writer(name) as f:
        hashing = _HashingWriter(f)
        torch.save(payload, hashing)
    identity = CheckpointIdentity(name, int(payload["step"]), hashing.hexdigest(), in_directory=True)
    store.put_bytes(POINTER, identity.pointer_line())
    _prune(store, keep, protect=name)
    return identity


def save_checkpoint(
    directory: str | os.PathLike[str] | CheckpointStore,
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
    """Snapshot and write in one call, synchronously (a collective: every rank calls it; rank 0
    writes). Returns the checkpoint's local path (or, in a remote store, its URL) on rank 0."""
    store = as_store(directory)
    payload = snapshot_checkpoint(
        ctx=ctx,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        config=config,
        extra=extra,
    )
    if payload is None:
        return None
    identity = write_checkpoint(store, payload, keep)
    return store.local_path(identity.name) or Path(store.describe(identity.name))


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


def _prune(store: CheckpointStore, keep: int, protect: str) -> None:
    if keep <= 0:
        return
    for _, old in checkpoint_steps(store)[:-keep]:
        if old != protect:
            store.delete(old)


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


__all__ = [
    "POINTER",
    "CheckpointIdentity",
    "ResumeError",
    "TrainingState",
    "agree_on_checkpoint",
    "checkpoint_name",
    "content_sha256",
    "discard_download",
    "fetch",
    "file_sha256",
    "folder_sha256",
    "load_checkpoint",
    "manifest_lines",
    "manifest_sha256",
    "resolve_checkpoint",
    "resolve_identity",
    "run_entries",
    "save_checkpoint",
    "snapshot_checkpoint",
    "training_state",
    "write_checkpoint",
]
