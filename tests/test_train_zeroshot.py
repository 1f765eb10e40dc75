"""Zero-shot classification on a labelled set in CLIP_benchmark's webdataset layout.

The trainer's top-1/top-5 (train a few steps, evaluate at the end) equal a direct computation:
open_clip's own ``build_zero_shot_classifier`` with the set's templates, over the same decoded
images, on the final weights. On 1 rank (the in-process trainer) and on 2 ranks (real torchrun,
the set split by its index), where every sample is counted once. Then the layout's rules: the
built-in ImageNet names and templates for a set without its own, and one clear error per bad file.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from labelled_set import LabelledSet, build_labelled_set
from shardstream.train.config import ConfigError
from train_support import build_small_dataset, read_log, small_config_args, torchrun

IMAGE_SIZE = 64  # shardstream-tiny's input


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> LabelledSet:
    return build_labelled_set(tmp_path_factory.mktemp("labelled"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    return build_small_dataset(tmp_path_factory.mktemp("data"))


def run_args(dataset, labelled: LabelledSet, output_dir: Path, *extra: str) -> list[str]:
    return small_config_args(
        dataset, output_dir, "--train.max_steps", "3", "--checkpoint.every_steps", "0",
        "--eval.zeroshot", labelled.root, "--eval.zeroshot_index", labelled.index, *extra,
    )  # fmt: skip


def direct_zeroshot(model: torch.nn.Module, labelled: LabelledSet) -> tuple[int, int, int]:
    """(top-1 hits, top-5 hits, samples) by open_clip's own classifier, over every sample of the
    set read by one loader (the images the trainer's loader decodes)."""
    import open_clip
    from shardstream import ShardLoader

    model.eval()
    tokenizer = open_clip.get_tokenizer("shardstream-tiny")
    templates = [lambda c, t=t: t.format(c=c) for t in labelled.templates]
    with torch.no_grad():
        classifier = open_clip.build_zero_shot_classifier(model, tokenizer, labelled.classnames, templates)
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(1, 3, 1, 1)
    loader = ShardLoader(
        labelled.shards, batch_size=50, image_size=IMAGE_SIZE, shuffle_buffer=1, drop_last=False,
        caption_key="cls", crop="center", rank=0, world_size=1,
    )  # fmt: skip
    top1 = top5 = samples = 0
    with torch.no_grad():
        for batch in loader:
            truth = torch.tensor([int(t) for t in batch.texts])
            images = (batch.images.float() / 255 - mean) / std
            logits = model.encode_image(images, normalize=True) @ classifier
            best = logits.topk(5, dim=1).indices
            top1 += int((best[:, 0] == truth).sum())
            top5 += int((best == truth[:, None]).any(dim=1).sum())
            samples += len(truth)
    return top1, top5, samples


def assert_same_accuracy(evaluation: dict, direct: tuple[int, int, int], labelled: LabelledSet) -> None:
    top1, top5, samples = direct
    assert samples == labelled.samples
    assert evaluation["zeroshot_samples"] == labelled.samples  # every sample once, over all ranks
    assert evaluation["zeroshot_top1"] * samples == pytest.approx(top1, abs=1e-6)
    assert evaluation["zeroshot_top5"] * samples == pytest.approx(top5, abs=1e-6)
    assert evaluation["zeroshot_chance"] == pytest.approx(1 / len(labelled.classnames))


def test_zeroshot_on_one_rank_equals_open_clip_classifier(
    dataset, labelled: LabelledSet, tmp_path: Path
) -> None:
    from shardstream.train import Trainer, load_config

    out = tmp_path / "run"
    trainer = Trainer(load_config(None, run_args(dataset, labelled, out, "--checkpoint.at_end", "false")))
    result = trainer.run()
    (evaluation,) = [r for r in read_log(out) if r["type"] == "eval"]
    assert result["eval"]["zeroshot_top1"] == evaluation["zeroshot_top1"]
    direct = direct_zeroshot(trainer.bundle.model, labelled)
    assert_same_accuracy(evaluation, direct, labelled)
    assert 0 < direct[0] <= direct[1] < labelled.samples  # neither metric is trivially 0 or 1


@pytest.mark.slow
def test_zeroshot_on_two_ranks_counts_each_sample_once(
    dataset, labelled: LabelledSet, tmp_path: Path
) -> None:
    """Each rank classifies its share (the index splits the set exactly); the counts are summed
    across ranks. The held-out retrieval and validation loss run beside it, on unequal shares."""
    import open_clip
    from shardstream.train.checkpoint import load_checkpoint
    from shardstream.train.model import register_model_configs

    out = tmp_path / "run"
    run = torchrun(run_args(dataset, labelled, out), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"zero-shot set {labelled.root}: 8 classes, 3 templates, " in run.stdout
    (evaluation,) = [r for r in read_log(out) if r["type"] == "eval"]
    register_model_configs()
    model = open_clip.create_model("shardstream-tiny")
    model.load_state_dict(load_checkpoint(out / "checkpoints" / "step-00000003.pt")["model"])
    assert_same_accuracy(evaluation, direct_zeroshot(model, labelled), labelled)
    assert evaluation["samples"] == 32 and math.isfinite(evaluation["val_loss"])


# -- the layout ------------------------------------------------------------------------------------


def copy_split(labelled: LabelledSet, root: Path) -> Path:
    """The set's shards under another root, without its text files."""
    (root / "test").mkdir(parents=True)
    for shard in [*labelled.shards, str(Path(labelled.shards[0]).with_name("nshards.txt"))]:
        (root / "test" / Path(shard).name).write_bytes(Path(shard).read_bytes())
    return root


def test_a_set_without_names_or_templates_gets_openai_imagenet_ones(
    labelled: LabelledSet, tmp_path: Path
) -> None:
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES
    from shardstream.train.zeroshot import load_zeroshot_set

    root = copy_split(labelled, tmp_path / "bare")
    bare = load_zeroshot_set(str(root))
    assert bare.classnames == list(IMAGENET_CLASSNAMES) and len(bare.classnames) == 1000
    assert [t("cat") for t in bare.templates] == [t("cat") for t in OPENAI_IMAGENET_TEMPLATES]
    assert len(bare.templates) == 80 and bare.builtin == ("class names", "templates")
    assert bare.shards == [str(root / "test" / Path(s).name) for s in labelled.shards]

    own = load_zeroshot_set(labelled.root)
    assert own.classnames == labelled.classnames and own.builtin == ()
    assert [t("a cat") for t in own.templates] == [
        "a photo of a cat.",
        "a crop of a picture of a cat.",
        "a cat",
    ]


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("zeroshot_classification_templates.txt", "a photo of {c}\na photo of {}\n",
         "zeroshot_classification_templates.txt line 2: a template may hold only {c}"),
        ("zeroshot_classification_templates.txt", "a photo\n",
         "zeroshot_classification_templates.txt line 1: the template has no {c}"),
        ("classnames.txt", "\n\n", "classnames.txt holds no class names"),
        ("test/nshards.txt", "none\n", "test/nshards.txt must hold a shard count >= 1, got 'none'"),
    ],
)  # fmt: skip
def test_a_bad_layout_file_is_one_error_naming_it(
    labelled: LabelledSet, tmp_path: Path, file: str, content: str, message: str
) -> None:
    from shardstream.train.zeroshot import load_zeroshot_set

    root = copy_split(labelled, tmp_path / "set")
    (root / "classnames.txt").write_text("a cat\na dog\n")
    (root / file).write_text(content)
    with pytest.raises(ConfigError, match=r"^eval\.zeroshot: .*" + re.escape(message)):
        load_zeroshot_set(str(root))


def test_a_missing_split_names_the_layout(tmp_path: Path) -> None:
    from shardstream.train.zeroshot import load_zeroshot_set

    with pytest.raises(ConfigError, match=r"eval\.zeroshot: .*/val/nshards\.txt not found: a labelled set"):
        load_zeroshot_set(str(tmp_path), split="val")


def test_a_class_index_outside_the_names_names_the_sample(
    dataset, labelled: LabelledSet, tmp_path: Path
) -> None:
    """Two class names for eight classes: the first sample of a class >= 2 stops the evaluation."""
    from shardstream.train import load_config, train

    root = copy_split(labelled, tmp_path / "set")
    (root / "classnames.txt").write_text("an astronaut\na cat\n")
    args = small_config_args(
        dataset, tmp_path / "run", "--train.max_steps", "1", "--checkpoint.at_end", "false",
        "--data.heldout", "", "--eval.zeroshot", str(root), "--eval.zeroshot_index", "",
    )  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"eval\.zeroshot: sample 'sample-\d+': cls must be a class index in \[0, 2\)"
    ):
        train(load_config(None, args))
