"""End-to-end runs of train_clip.py under a real torchrun (2 ranks, gloo): the default demo path
(generated data, evaluation across ranks, logs, TensorBoard, checkpoints), callbacks named in the
config, and the demo dataset itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from train_support import ROOT, build_small_dataset, read_log, small_config_args, torchrun

CALLBACK_MODULE = '''
import os
from shardstream.train import Callback

class Recorder(Callback):
    """Writes every hook call, per rank, to hooks-RANK.txt in the run folder."""

    def _note(self, trainer, text):
        with open(os.path.join(trainer.output_dir, f"hooks-{trainer.ctx.rank}.txt"), "a") as f:
            f.write(text + "\\n")

    def on_train_start(self, trainer):
        self._note(trainer, f"start {trainer.step}")

    def on_step_end(self, trainer, metrics):
        self._note(trainer, f"step {metrics['step']}")

    def on_eval(self, trainer, metrics):
        self._note(trainer, f"eval {int(metrics['samples'])}")

    def on_checkpoint(self, trainer, path):
        self._note(trainer, f"checkpoint {os.path.basename(path) if path else None}")

    def on_train_end(self, trainer):
        self._note(trainer, f"end {trainer.finished}")
'''


@pytest.mark.slow
def test_demo_run_generates_data_trains_evaluates_and_logs(tmp_path: Path) -> None:
    """The default config (the demo) with a short schedule: everything a user sees."""
    (tmp_path / "cb").mkdir()
    (tmp_path / "cb" / "recorder_cb.py").write_text(CALLBACK_MODULE)
    out = tmp_path / "run"
    args = [
        "--data.demo_dir", str(tmp_path / "demo"), "--train.output_dir", str(out),
        "--train.max_steps", "3", "--checkpoint.every_steps", "2", "--log.every_steps", "1",
        "--train.callbacks", "[recorder_cb:Recorder]",
    ]  # fmt: skip
    run = torchrun(args, timeout=300, extra_path=str(tmp_path / "cb"))
    assert run.returncode == 0, run.stdout + run.stderr
    # the learning-rate scaling is printed at the start
    assert (
        "lr 0.002 = base_lr 0.002 x sqrt(1) = x1 (global batch 128 vs base batch 128, sqrt rule)"
        in run.stdout
    )
    assert (
        "global batch 128 = 64 per device x 2 ranks x 1 accumulation; 62 steps per epoch, 3 steps"
        in run.stdout
    )

    records = read_log(out)
    start = records[0]
    assert start["type"] == "start" and start["world_size"] == 2 and start["backend"] == "gloo"
    step_records = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in step_records] == [1, 2, 3]
    for r in step_records:
        assert r["loss"] > 0 and r["lr"] > 0 and r["samples_per_s"] > 0 and 0 <= r["input_frac"] <= 1
    (evaluation,) = [r for r in records if r["type"] == "eval"]
    assert evaluation["samples"] == 512  # every held-out sample exactly once across the two ranks
    assert evaluation["zeroshot_samples"] == 512
    for key in (
        "image_to_text_R@1",
        "image_to_text_R@5",
        "text_to_image_R@1",
        "text_to_image_R@5",
        "zeroshot_top1",
    ):
        assert 0.0 <= evaluation[key] <= 1.0
    assert evaluation["zeroshot_chance"] == pytest.approx(1 / 32)
    assert [r["step"] for r in records if r["type"] == "checkpoint"] == [2, 3]
    assert records[-1]["type"] == "end" and records[-1]["finished"] is True

    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-00000002.pt", "step-00000003.pt"]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "tensorboard"))
    assert (tmp_path / "demo" / "zeroshot" / "classnames.txt").is_file()

    # callbacks: every hook on every rank. The built-ins run first (the checkpoint of step 2 is
    # announced before the user's on_step_end of step 2), and the final evaluation and checkpoint
    # come before the user's on_train_end.
    rank0 = (out / "hooks-0.txt").read_text().split("\n")[:-1]
    assert rank0 == [
        "start 0", "step 1", "checkpoint step-00000002.pt", "step 2", "step 3",
        "eval 512", "checkpoint step-00000003.pt", "end True",
    ]  # fmt: skip
    rank1 = (out / "hooks-1.txt").read_text().split("\n")[:-1]
    assert rank1 == [r if not r.startswith("checkpoint") else "checkpoint None" for r in rank0]


@pytest.mark.slow
def test_streaming_without_index_and_fp32(tmp_path: Path) -> None:
    """No index: the loader streams (shard-level split, samples_per_epoch); evaluation falls back to
    rank 0 reading the whole held-out set, which still counts every sample once."""
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = small_config_args(data, out, "--train.max_steps", "2", "--checkpoint.at_end", "false")
    args[args.index("--data.train_index") + 1] = ""
    args[args.index("--data.heldout_index") + 1] = ""
    args += ["--data.samples_per_epoch", str(data.train_samples)]
    run = torchrun(args, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    records = read_log(out)
    (evaluation,) = [r for r in records if r["type"] == "eval"]
    assert evaluation["samples"] == 32
    assert not (out / "checkpoints").exists()


def test_demo_dataset_is_deterministic_and_labelled(tmp_path: Path) -> None:
    from shardstream import read_samples
    from shardstream.train.data import DemoSpec, demo_classes, demo_templates, ensure_demo_data

    spec = DemoSpec(train_per_class=2, heldout_per_class=1, samples_per_shard=25)
    a = ensure_demo_data(tmp_path / "a", spec, log=lambda _: None)
    b = ensure_demo_data(tmp_path / "b", spec, log=lambda _: None)
    classes = demo_classes()
    assert len(classes) == 32  # 4 colours x 3 shapes x 2 sides + 8 photo classes
    # the labelled set (CLIP_benchmark's layout) holds the held-out images with their class index
    labelled = Path(a.zeroshot)
    assert (labelled / "classnames.txt").read_text().splitlines() == list(classes)
    templates = (labelled / "zeroshot_classification_templates.txt").read_text().splitlines()
    assert templates == demo_templates()
    for name, prompts in classes.items():  # every caption of a class is one of its zero-shot prompts
        assert set(prompts) <= {t.format(c=name) for t in templates}
    captioned = list(read_samples(a.heldout_shards))
    count = int((labelled / "test" / "nshards.txt").read_text())
    labelled_samples = list(read_samples([str(labelled / "test" / f"{i}.tar") for i in range(count)]))
    assert [s["__key__"] for s in labelled_samples] == [s["__key__"] for s in captioned]
    names = list(classes)
    for c, s in zip(captioned, labelled_samples, strict=True):
        assert c["jpg"] == s["jpg"] and c["txt"].decode() in classes[names[int(s["cls"])]]
    for x, y in zip(a.train_shards + a.heldout_shards, b.train_shards + b.heldout_shards, strict=True):
        assert Path(x).read_bytes() == Path(y).read_bytes()
    prompts = {p for ps in classes.values() for p in ps}
    samples = list(read_samples(a.train_shards))
    assert len(samples) == 64 and len({s["__key__"] for s in samples}) == 64
    assert all(s["txt"].decode() in prompts for s in samples)
    import io

    from PIL import Image

    assert Image.open(io.BytesIO(samples[0]["jpg"])).size == (64, 64)
    # an existing, current folder is reused as it is
    before = os.stat(a.train_shards[0]).st_mtime_ns
    ensure_demo_data(tmp_path / "a", spec, log=lambda _: None)
    assert os.stat(a.train_shards[0]).st_mtime_ns == before


def test_train_clip_help_lists_overrides() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(ROOT / "train_clip.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0
    assert "--section.field VALUE" in result.stdout and "--resume" in result.stdout


@pytest.mark.slow
def test_a_mixture_of_sources_from_the_config(tmp_path: Path) -> None:
    """data.sources: two indexed datasets mixed 3:1 in one exact epoch; the epoch record counts
    the samples of each source, summed over both ranks."""
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    sources = (
        f"[{{index: {data.train_index}, weight: 0.75, name: a}}, "
        f"{{index: {data.heldout_index}, weight: 0.25, name: b}}]"
    )
    args = small_config_args(data, out, "--train.epochs", "1", "--checkpoint.at_end", "false")
    args[args.index("--data.train") + 1] = ""
    args[args.index("--data.train_index") + 1] = ""
    args += ["--data.sources", sources, "--eval.every_steps", "0"]
    run = torchrun(args, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    (epoch,) = [r for r in read_log(out) if r["type"] == "epoch"]
    by_source = epoch["samples_by_source"]
    assert sum(by_source.values()) == epoch["samples"] > 0
    assert by_source["a"] > 2 * by_source["b"] > 0, by_source
