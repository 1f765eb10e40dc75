"""The trainer as a pip user reaches it: ``shardstream train`` (the console script), ``python -m
shardstream.train`` (what ``torchrun -m shardstream.train`` runs) and ``train_clip.py``, with the
configs shipped inside the package, chosen by name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from shardstream.train.config import SHIPPED_CONFIGS, ConfigError, load_config, resolve_config
from train_support import ROOT, build_small_dataset, read_log, run_bounded, small_config_args


def _console_script() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "shardstream")
    if not os.path.exists(path):
        pytest.fail(f"console script not installed at {path}")
    return path


def test_shardstream_train_help_lists_the_shipped_configs(tmp_path):
    run = run_bounded([_console_script(), "train", "--help"], timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: shardstream train")
    assert "demo_cpu, siglip_b16, vit_b16, vit_b32, vit_l14" in run.stdout
    assert "--section.field VALUE" in run.stdout


def test_the_top_level_help_lists_train(tmp_path):
    run = run_bounded([_console_script(), "--help"], timeout=60, cwd=tmp_path)
    assert run.returncode == 0 and "train " in run.stdout and "shardstream train --help" in run.stdout


@pytest.mark.parametrize("name", ["vit_b32", "vit_b32.yaml"])
def test_a_config_by_name_resolves_to_the_shipped_file(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing of that name here: the shipped one is meant
    assert resolve_config(name) == SHIPPED_CONFIGS / "vit_b32.yaml"
    assert load_config(name).model.name == "ViT-B-32"


def test_a_path_is_still_a_path_and_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("vit_b32").write_text("model:\n  name: ViT-B-16\n")
    assert load_config("vit_b32").model.name == "ViT-B-16"
    with pytest.raises(ConfigError, match=r"no shipped config of that name \(shipped: demo_cpu, "):
        load_config("vit_b33")


def test_the_shipped_configs_are_in_the_package_and_the_root_folder_is_gone():
    assert SHIPPED_CONFIGS.parent.name == "train" and SHIPPED_CONFIGS.parent.parent.name == "shardstream"
    assert not list((ROOT / "configs").glob("*.yaml")), "one copy of each config: the shipped one"


def test_a_placeholder_left_in_the_config_is_one_line_per_key(tmp_path):
    cmd = [sys.executable, "-m", "shardstream.train", "--config", "vit_b32", "--eval.zeroshot", ""]
    cmd += ["--eval.zeroshot_index", "", "--data.train_index", "laion.index"]
    run = run_bounded(cmd, timeout=60, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "python -m shardstream.train: config error: data.train is the config's placeholder "
        "'<SET ME: your shards, e.g. s3://bucket/laion/{000000..041407}.tar>': "
        "set it with --data.train VALUE or in the YAML file"
    ]
    # --print-config still shows the config, placeholders included, for editing
    shown = run_bounded([*cmd, "--print-config"], timeout=60, cwd=tmp_path)
    assert shown.returncode == 0 and "<SET ME: your shards" in shown.stdout


@pytest.mark.parametrize("how", ["override", "yaml"])
def test_a_naflex_sample_kind_is_refused_in_one_line_before_any_work(how, tmp_path):
    """Issue 30: the trainer's open_clip models take square images only, so ``data.sample
    naflex`` is refused up front, one line naming what is missing and where that kind trains;
    no demo data is generated and no run folder is made."""
    from importlib.metadata import version

    cmd = [sys.executable, str(ROOT / "train_clip.py")]
    if how == "override":
        cmd += ["--data.sample", "naflex"]
    else:
        (tmp_path / "naflex.yaml").write_text("data:\n  sample: naflex\n")
        cmd += ["--config", "naflex.yaml"]
    run = run_bounded(cmd, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stderr.splitlines() == [
        "train_clip.py: config error: data.sample: naflex needs a model that takes patch sequences, "
        f"and this trainer's models (open_clip {version('open_clip_torch')}) take square images only; "
        "train SigLIP 2 NaFlex through transformers' Siglip2Model with "
        "shardstream.integrations.hf.ShardTrainer and Siglip2Collator"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == (["naflex.yaml"] if how == "yaml" else [])
    # the square kind, named explicitly, is the default and still accepted
    assert load_config(None, ["--data.sample", "square"]).data.sample == "square" == load_config().data.sample


def test_python_m_shardstream_train_with_the_demo_config_by_name(tmp_path):
    """A tiny real run: the demo config by name, on a small generated dataset, two steps, one
    process (what each rank of ``torchrun -m shardstream.train`` runs)."""
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = small_config_args(data, out, "--train.max_steps", "2", "--checkpoint.at_end", "false")
    args += ["--eval.at_end", "false"]
    cmd = [sys.executable, "-m", "shardstream.train", "--config", "demo_cpu", *args]
    run = run_bounded(cmd, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = read_log(out)
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2]
    assert records[0]["world_size"] == 1 and records[-1]["type"] == "end"


def test_train_clip_py_still_runs_the_same_command(tmp_path):
    run = run_bounded(
        [sys.executable, str(ROOT / "train_clip.py"), "--config", "vit_b16", "--print-config"],
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "name: ViT-B-16" in run.stdout


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower()] = version
    return pins


def test_the_demo_requirements_are_pinned_and_a_subset_of_the_dev_ones():
    """scripts/demo.sh installs requirements/demo.txt alone: every package pinned as the test
    suite's, and everything the demo's run imports (the trainer's own check) among them."""
    from shardstream.train.config import Config
    from shardstream.train.deps import requirements

    demo, dev = _pins(ROOT / "requirements" / "demo.txt"), _pins(ROOT / "requirements" / "dev.txt")
    assert all(demo.values()), f"unpinned: {[n for n, v in demo.items() if not v]}"
    assert {n: dev.get(n) for n in demo} == demo, "demo.txt pins differ from dev.txt's"
    needed = {r.package.lower() for r in requirements(Config()) if r.in_extra}
    assert needed <= set(demo), needed - set(demo)
    assert {"tensorboard", "pillow", "scikit-image", "scikit-learn"} <= set(demo), "the demo's logs and data"
    assert len(demo) < len(dev) / 2
