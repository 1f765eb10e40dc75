"""The trainer's tokenizer for models whose tokenizer is not open_clip's CLIP BPE.

- ``model.tokenizer: PATH`` (a tokenizer.json, or a folder holding one) is run by the loader's
  Rust ``tokenizers`` path at the model's context length, and the trainer's own tokenizer (for
  evaluation prompts) gives the same tokens;
- a model whose tokenizer is a Hugging Face one (ViT-B-16-SigLIP) without ``transformers``: every
  rank says in one line what to install or set, before any process group or model (it used to die
  with a raw ModuleNotFoundError on every rank); with ``transformers`` but without the tokenizer's
  files (no network), one line too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import good_samples, sample_members, tar_bytes, write_file
from shardstream import ShardLoader
from shardstream.train.config import ConfigError, load_config
from shardstream.train.model import create_model
from train_support import torchrun

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizers", "captions-bpe.json")
HF_MODEL = "ViT-B-16-SigLIP"  # text_cfg.hf_tokenizer_name: timm/ViT-B-16-SigLIP


@pytest.mark.parametrize("as_folder", [False, True])
def test_a_local_tokenizer_json_runs_in_the_loader_at_the_models_context_length(
    tmp_path: Path, as_folder: bool
) -> None:
    spec = FIXTURE
    if as_folder:  # a Hugging Face tokenizer folder
        shutil.copy(FIXTURE, tmp_path / "tokenizer.json")
        spec = str(tmp_path)
    bundle = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu"), tokenizer=spec)
    assert bundle.context_length == 16
    captions = [f"a photo of {n} red shapes on a long winding road near the sea" for n in range(12)]
    members = []
    for (key, sample), caption in zip(good_samples(len(captions)), captions, strict=True):
        members += sample_members(key, dict(sample, txt=caption))
    shard = write_file(str(tmp_path / "caps-0000.tar"), tar_bytes(members))

    from shardstream.train.loaders import loader_tokenizer

    args = loader_tokenizer(load_config(None, ["--model.tokenizer", spec]), bundle.context_length)
    assert args == {
        "tokenizer": FIXTURE if not as_folder else str(tmp_path / "tokenizer.json"),
        "context_length": 16,
    }
    loader = ShardLoader(shard, batch_size=4, image_size=32, threads=1, drop_last=False, **args)
    seen = 0
    for batch in loader:
        assert tuple(batch.tokens.shape) == (len(batch.texts), 16)
        assert torch.equal(batch.tokens, bundle.tokenizer(list(batch.texts)))
        seen += len(batch.texts)
    assert seen == 12

    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(FIXTURE)
    reference.enable_truncation(16)
    ids = reference.encode(captions[0]).ids
    row = np.zeros(16, dtype=np.int64)
    row[: len(ids)] = ids
    assert np.array_equal(bundle.tokenizer([captions[0]])[0].numpy(), row)


def test_a_tokenizer_path_that_is_not_one_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.tokenizer: .*neither a tokenizer.json file nor a folder"):
        create_model("shardstream-tiny", pretrained="", device=torch.device("cpu"), tokenizer=str(tmp_path))


HIDE_TRANSFORMERS = """
import sys

class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
"""


@pytest.mark.slow
def test_a_hugging_face_tokenizer_without_transformers_is_one_line_on_every_rank(tmp_path: Path) -> None:
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE_TRANSFORMERS)
    args = [
        "--model.name",
        HF_MODEL,
        "--train.output_dir",
        str(tmp_path / "run"),
        "--log.tensorboard",
        "false",
    ]
    run = torchrun(args, timeout=180, extra_path=str(tmp_path / "hide"))
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("train_clip.py: error:")]
    assert len(lines) == 2, run.stderr  # one per rank
    for line in lines:
        assert f"model.name {HF_MODEL} (its Hugging Face tokenizer 'timm/ViT-B-16-SigLIP')" in line
        assert "needs the transformers package" in line and "--model.tokenizer PATH" in line
    assert "ModuleNotFoundError" not in run.stderr  # (torchrun's own traceback of the exit 2 stays)
    assert not (tmp_path / "run").exists()  # stopped before anything was written


def test_a_hugging_face_tokenizer_without_its_files_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing to download here: the files are not cached
    with pytest.raises(ConfigError) as raised:
        create_model(HF_MODEL, pretrained="", device=torch.device("cpu"))
    message = str(raised.value)
    assert "\n" not in message and "timm/ViT-B-16-SigLIP" in message and "model.tokenizer" in message
