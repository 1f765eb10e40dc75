"""Checkpoint files: atomic, complete, pruned, and never unpickling arbitrary objects."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from shardstream.train import checkpoint as ckpt
from shardstream.train.dist import DistContext
from shardstream.train.schedule import WarmupCosine

SINGLE = DistContext(
    rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend=None
)


def small_run() -> tuple[torch.nn.Module, torch.optim.Optimizer, WarmupCosine]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    scheduler = WarmupCosine(optimizer, peak_lr=1e-3, total_steps=10, warmup_steps=2)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def save(directory: Path, step: int, model, optimizer, scheduler, keep: int = 2) -> Path:
    state = ckpt.TrainingState(step=step, epoch=1, step_in_epoch=2, loader_state={"epoch": 1, "batches": 4})
    path = ckpt.save_checkpoint(
        directory,
        ctx=SINGLE,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        config={"train": {"seed": 0}},
        keep=keep,
    )
    assert path is not None
    return path


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    model, optimizer, scheduler = small_run()
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    path = save(tmp_path, 3, model, optimizer, scheduler)
    expected_draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    payload = ckpt.load_checkpoint(ckpt.resolve_checkpoint("latest", tmp_path))
    other, other_opt, other_sched = small_run()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    other.load_state_dict(payload["model"])
    other_opt.load_state_dict(payload["optimizer"])
    other_sched = WarmupCosine(other_opt, peak_lr=1e-3, total_steps=10, warmup_steps=2)
    other_sched.load_state_dict(payload["scheduler"])
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert other_sched.step_count == 3 and other_opt.param_groups[0]["lr"] == scheduler.lr

    state = ckpt.training_state(payload)
    assert (state.step, state.epoch, state.step_in_epoch) == (3, 1, 2)
    assert state.loader_state == {"epoch": 1, "batches": 4}
    assert payload["world_size"] == 1 and len(payload["rng"]) == 1

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    ckpt.set_rng_state(payload["rng"][0])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_draws
    assert path.name == "step-00000003.pt"


def test_writes_are_atomic_and_old_checkpoints_pruned(tmp_path: Path) -> None:
    model, optimizer, scheduler = small_run()
    for step in (10, 20, 30):
        save(tmp_path, step, model, optimizer, scheduler, keep=2)
    names = sorted(os.listdir(tmp_path))
    assert names == ["latest", "step-00000020.pt", "step-00000030.pt"]  # no temporary files left
    # the pointer records the checkpoint's identity: name, step and the sha256 of its bytes
    pointer = json.loads((tmp_path / "latest").read_text())
    assert pointer == {
        "name": "step-00000030.pt",
        "step": 30,
        "sha256": hashlib.sha256((tmp_path / "step-00000030.pt").read_bytes()).hexdigest(),
    }
    assert ckpt.resolve_checkpoint("latest", tmp_path).name == "step-00000030.pt"
    # without the pointer, 'latest' is the highest step present
    (tmp_path / "latest").unlink()
    assert ckpt.resolve_checkpoint("latest", tmp_path).name == "step-00000030.pt"
    assert ckpt.resolve_checkpoint(str(tmp_path / "step-00000020.pt"), tmp_path).name == "step-00000020.pt"


def test_missing_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        ckpt.resolve_checkpoint("latest", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="checkpoint file not found"):
        ckpt.resolve_checkpoint(str(tmp_path / "x.pt"), tmp_path)
    (tmp_path / "torn.pt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    with pytest.raises(ValueError, match="cannot load checkpoint"):
        ckpt.load_checkpoint(tmp_path / "torn.pt")
    torch.save({"model": {}}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a shardstream CLIP checkpoint"):
        ckpt.load_checkpoint(tmp_path / "foreign.pt")


class _Payload:
    """An object whose unpickling would run code: creates a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_loading_never_unpickles_arbitrary_objects(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    torch.save({"format": ckpt.FORMAT, "version": 1, "model": _Payload(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="cannot load checkpoint"):
        ckpt.load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_snapshot_is_a_copy_and_reusing_its_buffers_takes_the_new_values(tmp_path: Path) -> None:
    model, optimizer, scheduler = small_run()
    state = ckpt.TrainingState(step=3, epoch=0, step_in_epoch=3, loader_state=None)
    args = {"ctx": SINGLE, "model": model, "optimizer": optimizer, "scheduler": scheduler, "config": {}}
    first = ckpt.snapshot_checkpoint(state=state, **args)
    assert first is not None
    weight = first["model"]["0.weight"]
    before = weight.clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training goes on: the snapshot keeps the step's values
    assert torch.equal(weight, before)
    assert weight.data_ptr() != model[0].weight.data_ptr()
    second = ckpt.snapshot_checkpoint(state=state, reuse=first, **args)
    assert second is not None
    assert second["model"]["0.weight"].data_ptr() == weight.data_ptr()  # the same buffer, overwritten
    assert torch.equal(second["model"]["0.weight"], model[0].weight)
    moments = second["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(moments, optimizer.state[model[0].weight]["exp_avg"])
    assert moments.data_ptr() != optimizer.state[model[0].weight]["exp_avg"].data_ptr()
