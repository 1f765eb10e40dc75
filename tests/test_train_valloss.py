"""Validation loss on the held-out set: reported with the other evaluation metrics every
``eval.every_steps`` and at the end, and equal to a direct computation on 1 rank (open_clip's
ClipLoss of every held-out batch of ``eval.batch_size`` samples, averaged over samples).

It calls the trainer's own loss (``trainer.loss_fn``), on a copy that does not gather across
ranks (the ranks' held-out shares differ in size); the 2-rank run in test_train_zeroshot.py
covers that it neither hangs nor disturbs training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_support import build_small_dataset, read_log, small_config_args

EVAL_BATCH = 12  # 32 held-out samples: batches of 12, 12 and 8


def direct_val_loss(model: torch.nn.Module, data) -> float:
    import open_clip
    from shardstream import ShardLoader

    model.eval()
    tokenizer = open_clip.get_tokenizer("shardstream-tiny")
    loss_fn = open_clip.ClipLoss()
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(1, 3, 1, 1)
    loader = ShardLoader(
        data.heldout.split("::"), index=data.heldout_index, batch_size=EVAL_BATCH, image_size=64, seed=0,
        shuffle_buffer=1, drop_last=False, crop="center", rank=0, world_size=1,
    )  # fmt: skip
    total, samples, sizes = 0.0, 0, []
    with torch.no_grad():
        for batch in loader:
            images = (batch.images.float() / 255 - mean) / std
            out = model(images, tokenizer(list(batch.texts)))
            loss = loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
            total += float(loss) * len(batch.texts)
            samples += len(batch.texts)
            sizes.append(len(batch.texts))
    assert sizes == [12, 12, 8]
    return total / samples


def test_val_loss_every_eval_and_equal_to_a_direct_computation(tmp_path: Path) -> None:
    from shardstream.train import Trainer, load_config

    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = small_config_args(
        data, out, "--train.max_steps", "4", "--eval.every_steps", "2", "--eval.batch_size", str(EVAL_BATCH),
        "--eval.zeroshot", "", "--checkpoint.every_steps", "0", "--checkpoint.at_end", "false",
    )  # fmt: skip
    trainer = Trainer(load_config(None, args))
    trainer.run()
    evaluations = [r for r in read_log(out) if r["type"] == "eval"]
    assert [r["step"] for r in evaluations] == [2, 4]
    assert evaluations[0]["val_loss"] != evaluations[1]["val_loss"]  # the weights changed between them
    assert evaluations[1]["samples"] == 32
    assert evaluations[1]["val_loss"] == pytest.approx(direct_val_loss(trainer.bundle.model, data), rel=1e-5)


def test_the_rank_local_copy_leaves_the_trainers_loss_alone() -> None:
    """The copy gathers nothing across ranks, and the labels it caches stay its own: the trainer's
    ClipLoss (rank 1 of 2, which offsets its labels by its rank) still has its state after the
    copy has computed a loss on a batch of the same size."""
    import open_clip
    from shardstream.train.evaluate import rank_local_loss
    from shardstream.train.loss import make_loss

    trainer_loss = make_loss("clip", 1, 2)
    trainer_loss.contrastive.get_ground_truth(torch.device("cpu"), 4)  # what a step on rank 1 caches
    cached = trainer_loss.contrastive.labels[torch.device("cpu")].clone()
    local = rank_local_loss(trainer_loss)
    features = torch.nn.functional.normalize(
        torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    loss = local({"image_features": features, "text_features": features, "logit_scale": torch.tensor(10.0)})
    expected = open_clip.ClipLoss()(features, features, torch.tensor(10.0))
    assert float(loss) == pytest.approx(float(expected))
    assert trainer_loss.contrastive.world_size == 2 and trainer_loss.contrastive.rank == 1
    assert trainer_loss.world_size == 2
    labels = trainer_loss.contrastive.labels[torch.device("cpu")]
    assert torch.equal(labels, cached) and cached.tolist() == [4, 5, 6, 7]


def test_the_rank_local_copy_of_a_siglip_loss_is_its_single_rank_loss() -> None:
    """Any open_clip loss: SigLIP's (pairwise sigmoid, with a bias) exchanges features with its
    neighbour ranks when world_size > 1; its copy computes the one-rank loss of the batch."""
    from open_clip.loss import SigLipLoss
    from shardstream.train.evaluate import rank_local_loss
    from shardstream.train.loss import make_loss

    local = rank_local_loss(make_loss("siglip", 1, 2))
    generator = torch.Generator().manual_seed(1)
    image = torch.nn.functional.normalize(torch.randn(5, 8, generator=generator), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(5, 8, generator=generator), dim=-1)
    outputs = {
        "image_features": image, "text_features": text,
        "logit_scale": torch.tensor(10.0), "logit_bias": torch.tensor(-10.0),
    }  # fmt: skip
    expected = SigLipLoss()(image, text, torch.tensor(10.0), torch.tensor(-10.0))
    assert float(local(outputs)) == pytest.approx(float(expected))
