"""``log.wandb: true`` logs to Weights & Biases on rank 0, in ``WANDB_MODE=offline`` here (a real
wandb run folder under output_dir/wandb, no server): the run's history holds every step's
metrics as log.jsonl has them, the checkpoint keeps the run id, and a resumed run continues the same run id.
A missing wandb is one line naming the switch that turns it off."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from shardstream.train.checkpoint import load_checkpoint
from shardstream.train.config import load_config
from test_train_deps import _Hidden
from train_support import ROOT, build_small_dataset, read_log, run_bounded, small_config_args

ARGS = [
    "--data.heldout", "", "--eval.zeroshot", "", "--train.max_steps", "6", "--log.every_steps", "2",
    "--checkpoint.every_steps", "0", "--log.wandb", "true", "--log.wandb_project", "shardstream-test",
    "--log.wandb_name", "tiny-offline", "--log.wandb_tags", "[ci, tiny]",
]  # fmt: skip


def test_a_missing_wandb_is_one_line_naming_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardstream.train.deps import problems

    monkeypatch.setattr(sys, "meta_path", [_Hidden("wandb"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    cfg = load_config(None, ["--log.wandb", "true", "--log.tensorboard", "false"])
    assert problems(cfg) == [
        "log.wandb needs the wandb package, which is not installed: pip install wandb, "
        "or turn it off: --log.wandb false"
    ]
    assert problems(load_config(None, ["--log.tensorboard", "false"])) == []


def offline_runs(out: Path) -> list[Path]:
    return sorted((out / "wandb").glob("offline-run-*"))


def history(run: Path) -> dict[int, dict[str, float]]:
    """The history rows in the run's ``.wandb`` file, by step: a LevelDB-style log (7-byte file
    header; 32 KiB blocks of records, each crc32, length, type: full, first, middle, last) of
    wandb's ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run.glob("run-*.wandb")
    data, block = path.read_bytes(), 32768
    pos, part, rows = 7, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                row = {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item
                }
                rows[int(row["_step"])] = row
    return rows


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_offline_run_holds_the_metrics_and_a_resume_continues_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train_clip.py"), *small_config_args(data, out, *ARGS)]
    first = run_bounded([*cmd, "--train.stop_at_step", "3"], timeout=240)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (run,) = offline_runs(out)
    run_id = run.name.rsplit("-", 1)[1]
    assert load_checkpoint(out / "checkpoints" / "step-00000003.pt")["wandb_run_id"] == run_id
    steps = {r["step"]: r for r in read_log(out) if r["type"] == "step"}
    logged = history(run)
    assert sorted(logged) == [1, 2, 3]
    for step, row in logged.items():
        assert row["train/loss"] == steps[step]["loss"] and row["train/lr"] == steps[step]["lr"], step

    second = run_bounded([*cmd, "--resume", "latest"], timeout=240)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    runs = offline_runs(out)
    assert len(runs) == 2 and [r.name.rsplit("-", 1)[1] for r in runs] == [run_id, run_id]
    steps = {r["step"]: r for r in read_log(out) if r["type"] == "step"}
    resumed = history(runs[1])
    assert sorted(resumed) == [4, 5, 6]  # the same run continues after the checkpoint's step
    assert all(row["train/loss"] == steps[step]["loss"] for step, row in resumed.items())
