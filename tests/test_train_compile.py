"""``train.compile``: a compiled run completes, its checkpoint holds the plain model's weights
(no ``_orig_mod.`` prefix: open_clip and an uncompiled run load it), and resuming it is exact: a
run resumed from the step-2 checkpoint logs the losses of the uninterrupted run's steps 3 and 4."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from train_support import ROOT, build_small_dataset, read_log, run_bounded, small_config_args


@pytest.mark.slow
def test_a_compiled_run_completes_and_resumes_exactly(tmp_path: Path) -> None:
    data = build_small_dataset(tmp_path / "data")

    def train(out: Path, *extra: str):
        args = small_config_args(
            data, out, "--train.compile", "true", "--train.max_steps", "4", "--checkpoint.every_steps", "2",
            "--checkpoint.keep", "0", "--log.every_steps", "1", "--eval.at_end", "false", *extra,
        )  # fmt: skip
        run = run_bounded([sys.executable, str(ROOT / "train_clip.py"), *args], timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
        return {r["step"]: r["loss"] for r in read_log(out) if r["type"] == "step"}

    whole = train(tmp_path / "whole")
    assert sorted(whole) == [1, 2, 3, 4]
    checkpoint = tmp_path / "whole" / "checkpoints" / "step-00000002.pt"
    from shardstream.train.checkpoint import load_checkpoint

    keys = load_checkpoint(checkpoint)["model"].keys()
    assert "logit_scale" in keys and not any(k.startswith("_orig_mod.") for k in keys)
    resumed = train(tmp_path / "resumed", "--train.resume", str(checkpoint))
    assert sorted(resumed) == [3, 4]
    assert [resumed[s] for s in (3, 4)] == [whole[s] for s in (3, 4)]
