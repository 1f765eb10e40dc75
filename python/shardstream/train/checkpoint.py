"""Checkpoints: written atomically, read without unpickling arbitrary objects.

A checkpoint is one file ``checkpoints/step-00000100.pt`` holding the model, optimizer and
scheduler state, every rank's RNG states, the loader state and the position in the run. It is
written by rank 0 to a temporary file, flushed to disk and renamed into place, then the small
pointer file ``checkpoints/latest`` is replaced the same way: a crash at any moment leaves either
the previous checkpoint or the new one, never a torn file.

Everything in it is a tensor or a plain value (dict, list, str, int, float, bool); the loader
state and the config are stored as JSON text. Loading uses ``torch.load(weights_only=True)``,
which refuses anything else, so a checkpoint file cannot run code.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardstream._files import AtomicFile, atomic_write
from shardstream.train.dist import DistContext, all_gather

FORMAT = "shardstream-clip-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step-(\d{8,})\.pt$")


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
        torch.save(payload, f.file)
    atomic_write(directory / "latest", path.name.encode() + b"\n", fsync=True)
    _prune(directory, keep, protect=path)
    return path


def _prune(directory: Path, keep: int, protect: Path) -> None:
    if keep <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)))
    for _, old in steps[:-keep]:
        if old != protect:
            old.unlink(missing_ok=True)


def resolve_checkpoint(spec: str, directory: str | os.PathLike[str]) -> Path:
    """``'latest'`` (the pointer file, else the highest step present) or a file path."""
    directory = Path(directory)
    if spec != "latest":
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"train.resume: checkpoint file not found: {path}")
        return path
    pointer = directory / "latest"
    if pointer.is_file():
        path = directory / pointer.read_text().strip()
        if path.is_file():
            return path
    candidates = (
        sorted((int(m.group(1)), p) for p in directory.glob("step-*.pt") if (m := _NAME.match(p.name)))
        if directory.is_dir()
        else []
    )
    if not candidates:
        raise FileNotFoundError(f"train.resume latest: no checkpoint in {directory}")
    return candidates[-1][1]


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
