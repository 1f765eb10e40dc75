"""``python -m shardstream.train export``: a checkpoint's weights as an open_clip state dict.

Train a few steps (the in-process trainer), export the final checkpoint, then load the export in
a fresh interpreter with open_clip alone (the calls the command prints: no shardstream import),
whose image and text features equal the trainer's model's to 1e-5. Bad input is one line, exit 2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from train_support import ROOT, build_small_dataset, run_bounded, small_config_args

# Runs the lines the export printed, in an interpreter where shardstream is not importable, and
# saves the loaded model's features of the given inputs.
LOADER = """
import sys
import torch
sys.modules["shardstream"] = None  # open_clip alone: importing shardstream would fail
calls = open(sys.argv[1]).read()
namespace = {}
exec(calls, namespace)
model = namespace["model"].eval()
inputs = torch.load(sys.argv[2])
with torch.no_grad():
    features = {
        "image": model.encode_image(inputs["images"], normalize=True),
        "text": model.encode_text(namespace["tokenizer"](inputs["texts"]), normalize=True),
    }
torch.save(features, sys.argv[3])
"""


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bounded([sys.executable, "-m", "shardstream.train", "export", *args], timeout=120)


def printed_calls(stdout: str) -> str:
    lines = stdout.splitlines()
    start = lines.index("load it with open_clip:") + 1
    return "\n".join(line.strip() for line in lines[start:])


def test_export_loads_in_open_clip_with_the_trainers_features(tmp_path: Path) -> None:
    from shardstream.train import Trainer, load_config

    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = small_config_args(
        data, out, "--train.max_steps", "3", "--checkpoint.every_steps", "0",
        "--data.heldout", "", "--eval.zeroshot", "",
    )  # fmt: skip
    trainer = Trainer(load_config(None, args))
    trainer.run()
    checkpoint = out / "checkpoints" / "step-00000003.pt"

    exported = tmp_path / "export" / "model.pt"
    run = export(str(checkpoint), "-o", str(exported))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"exported step 3 of shardstream-tiny (7.8 M parameters) to {exported}" in run.stdout
    calls = printed_calls(run.stdout)
    config = exported.with_name("shardstream-tiny.json")
    assert calls.splitlines() == [
        "import open_clip",
        f"open_clip.add_model_config({str(config)!r})",
        f"model = open_clip.create_model('shardstream-tiny', pretrained={str(exported)!r})",
        "tokenizer = open_clip.get_tokenizer('shardstream-tiny')",
    ]
    assert torch.load(exported, weights_only=True).keys() == trainer.bundle.model.state_dict().keys()

    model = trainer.bundle.model.eval()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(6, 3, 64, 64, generator=generator)
    texts = ["a red circle on the left", "a photo of a cat", "a drawing of a blue square on the right"]
    (tmp_path / "calls.py").write_text(calls)
    torch.save({"images": images, "texts": texts}, tmp_path / "inputs.pt")
    (tmp_path / "load.py").write_text(LOADER)
    cmd = [
        sys.executable,
        str(tmp_path / "load.py"),
        *(str(tmp_path / n) for n in ("calls.py", "inputs.pt", "f.pt")),
    ]
    loaded = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    features = torch.load(tmp_path / "f.pt", weights_only=True)
    with torch.no_grad():
        expected_image = model.encode_image(images, normalize=True)
        expected_text = model.encode_text(trainer.bundle.tokenizer(texts), normalize=True)
    torch.testing.assert_close(features["image"], expected_image, atol=1e-5, rtol=0)
    torch.testing.assert_close(features["text"], expected_text, atol=1e-5, rtol=0)


def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    run = export(str(missing), "-o", str(tmp_path / "model.pt"))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"python -m shardstream.train export: error: checkpoint not found: {missing}"
    ]

    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    run = export(str(text), "-o", str(tmp_path / "model.pt"))
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(
        f"python -m shardstream.train export: error: cannot load checkpoint {text}: "
    )

    weights_only = tmp_path / "state.pt"
    torch.save({"visual.proj": torch.zeros(2, 2)}, weights_only)  # a state dict, not a checkpoint
    run = export(str(weights_only), "-o", str(tmp_path / "model.pt"))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"python -m shardstream.train export: error: {weights_only} is not a shardstream CLIP checkpoint"
    ]
    assert not (tmp_path / "model.pt").exists()


def test_export_is_listed_in_the_training_help() -> None:
    run = run_bounded([sys.executable, str(ROOT / "train_clip.py"), "--help"], timeout=60)
    assert run.returncode == 0 and "python -m shardstream.train export" in run.stdout
