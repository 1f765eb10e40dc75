"""The training config: YAML files, command-line overrides, and errors that name the field."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shardstream.train.config import (
    SECTIONS,
    SHIPPED_CONFIGS,
    Config,
    ConfigError,
    describe_config,
    load_config,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(SHIPPED_CONFIGS.glob("*.yaml"))


def all_fields() -> list[tuple[str, str, dataclasses.Field]]:
    return [(s, f.name, f) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def test_shipped_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"demo_cpu.yaml", "vit_b32.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_every_field_is_documented_in_the_schema_and_the_demo_config() -> None:
    demo_text = (SHIPPED_CONFIGS / "demo_cpu.yaml").read_text()
    demo = yaml.safe_load(demo_text)
    for section, name, f in all_fields():
        assert f.metadata.get("doc"), f"{section}.{name} has no documentation"
        assert name in (demo.get(section) or {}), f"demo_cpu.yaml does not list {section}.{name}"
        # each field's line in the demo config carries a comment explaining it
        line = next(ln for ln in demo_text.splitlines() if ln.strip().startswith(f"{name}:"))
        assert "#" in line, f"demo_cpu.yaml: {section}.{name} has no comment"
    reference = describe_config()
    for _, name, _ in all_fields():
        assert f"  {name}:" in reference


def test_demo_config_is_the_schema_default() -> None:
    """With no --config the trainer runs the demo; the defaults and demo_cpu.yaml agree."""
    assert load_config(SHIPPED_CONFIGS / "demo_cpu.yaml").to_dict() == Config().to_dict()


def test_overrides_are_typed_by_the_schema() -> None:
    cfg = load_config(
        None,
        [
            "--train.batch_size",
            "32",
            "--optim.base_lr=1e-3",
            "--log.tensorboard",
            "false",
            "--eval.recall_k",
            "[1, 10]",
            "--train.output_dir",
            "123",  # a str field keeps the text, even when it looks like a number
            "--model.precision",
            "fp32",
        ],
    )
    assert cfg.train.batch_size == 32
    assert cfg.optim.base_lr == pytest.approx(1e-3)
    assert cfg.log.tensorboard is False
    assert cfg.eval.recall_k == [1, 10]
    assert cfg.train.output_dir == "123"
    assert cfg.model.precision == "fp32"


def test_yaml_scientific_notation_is_a_float(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  base_lr: 5e-4\n")  # YAML 1.1 reads this as a string
    assert load_config(path).optim.base_lr == pytest.approx(5e-4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--train.batchsize", "3"],
            "unknown config field 'train.batchsize' (did you mean 'train.batch_size'?)",
        ),
        (["--trian.batch_size", "3"], "unknown config field 'trian.batch_size'"),
        (["--train.batch_size", "many"], "train.batch_size: expected int, got 'many'"),
        (["--train.batch_size", "0"], "train.batch_size: must be >= 1, got 0"),
        (
            ["--model.precision", "fp8"],
            "model.precision: expected one of 'bf16', 'fp16', 'fp32', 'pure_bf16', got 'fp8'",
        ),
        (["--optim.betas", "[0.9]"], "optim.betas: must be two numbers in [0, 1)"),
        (["--optim.base_lr", "-1"], "optim.base_lr: must be > 0"),
        (["--data.crop_ratio", "[2.0, 1.0]"], "data.crop_ratio: must be two aspect ratios 0 < low <= high"),
        (["--data.crop_ratio", "[0, 2.0]"], "data.crop_ratio: must be two aspect ratios 0 < low <= high"),
        (["--log.tensorboard", "maybe"], "log.tensorboard: expected bool"),
        (["--train.callbacks", "[nocolon]"], "train.callbacks[0]: expected 'package.module:ClassName'"),
        (["--train.batch_size"], "train.batch_size: missing value"),
        (["batch_size=3"], "unexpected argument 'batch_size=3'"),
        (["--data.train", "/x/{0..9}.tar"], "data.train_index: without an index"),
    ],
)
def test_bad_overrides_name_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_yaml_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochs: ten\n")
    with pytest.raises(ConfigError, match=r"train\.epochs: expected int, got 'ten'"):
        load_config(path)
    path.write_text("trainer:\n  epochs: 1\n")
    with pytest.raises(ConfigError, match="unknown config field 'trainer'"):
        load_config(path)
    path.write_text("train: [1, 2]\n")
    with pytest.raises(ConfigError, match="train: expected a mapping"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_cli_reports_config_errors_with_exit_status_2() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "train_clip.py"), "--train.epochs", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "config error: train.epochs: must be >= 1, got 0" in result.stderr


def test_cli_prints_the_resolved_config() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "train_clip.py"), "--print-config", "--train.batch_size", "16"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["train"]["batch_size"] == 16


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--data.train", "/nonexistent/shard-{000..003}.tar", "--data.samples_per_epoch", "100"],
         "data.train: cannot open the shards: unreadable in /nonexistent/shard-000.tar"),
        (["--model.name", "ViT-B-99"], "model.name: unknown open_clip model 'ViT-B-99'"),
    ],
)  # fmt: skip
def test_problems_found_at_start_name_the_field(tmp_path: Path, overrides: list[str], message: str) -> None:
    from shardstream.train import train

    no_eval = ["--data.heldout", "", "--eval.zeroshot", ""]
    cfg = load_config(None, [*overrides, *no_eval, "--train.output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg)
