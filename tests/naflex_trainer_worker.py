"""One rank of transformers.Trainer on NaFlex batches (run by test_naflex_trainer.py under
torchrun): a tiny Siglip2Model from a config (nothing downloaded) trains on real-photo shards
through ShardTrainer and Siglip2Collator, checkpointing every --save-steps up to --max-steps,
optionally resuming; with --budget-counts, on token-budget batches (NaFlexBudgetLoader). Each
batch's keys are logged as the collator hands it over; rank 0 logs each step's loss and the
model's logit_bias."""

from __future__ import annotations

import argparse
import json
import os

import torch
from integration_support import SEED, KeyLog, end_worker
from shardstream import NaFlex, NaFlexBudgetLoader, ShardLoader, count_patches
from shardstream.integrations.hf import ShardTrainer, Siglip2Collator
from transformers import Siglip2Config, Siglip2Model, TrainerCallback, TrainingArguments

TOKENIZER = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "tokenizers", "captions-bpe.json"
)


def tiny_siglip2() -> Siglip2Model:
    vocab = len(json.load(open(TOKENIZER))["model"]["vocab"])
    text = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 16}  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": 16, "num_patches": 16}  # fmt: skip
    return Siglip2Model(Siglip2Config(text_config=text, vision_config=vision))


def naflex_loader(shards: str, index: str, rank: int | None = None, world: int | None = None) -> ShardLoader:
    """The loader the runs train with; the test makes the same one for the reference keys."""
    return ShardLoader(
        shards, index=index, batch_size=4, seed=SEED, shuffle_buffer=6, threads=1, rank=rank,
        world_size=world, tokenizer=TOKENIZER, context_length=16,
        sample=NaFlex(patch_size=16, max_num_patches=16),
    )  # fmt: skip


def budget_loader(
    shards: str, counts_path: str, rank: int | None = None, world: int | None = None
) -> NaFlexBudgetLoader:
    """The token-budget loader the --budget runs train with (up to 4 images of 16 patches a
    batch); the test makes the same one for the reference keys. The counts are made once, by
    the test, before torchrun starts."""
    return NaFlexBudgetLoader(
        counts_path, seed=SEED, threads=1, rank=rank, world_size=world, tokenizer=TOKENIZER, context_length=16
    )


def count_budget(shards: str, counts_path: str) -> None:
    """The counts the --budget runs share (written once, before any rank starts)."""
    count_patches(
        shards, naflex=NaFlex(patch_size=16, max_num_patches=16), max_patches_per_batch=64, output=counts_path
    )


class Log(TrainerCallback):
    def __init__(self, path: str, model: Siglip2Model) -> None:
        self.path, self.model = path, model

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if logs and "loss" in logs and state.is_world_process_zero:
            bias = float(self.model.logit_bias.detach().reshape(-1)[0])
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(
                    json.dumps({"step": state.global_step, "loss": logs["loss"], "logit_bias": bias}) + "\n"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--keys-dir", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--save-steps", type=int, required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--budget-counts", default=None, help="train on token-budget batches of these counts")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, save_strategy="steps", save_steps=a.save_steps,
        per_device_train_batch_size=4, learning_rate=1e-2, use_cpu=True, ddp_backend="gloo", report_to=[],
        logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    loader = budget_loader(a.shards, a.budget_counts) if a.budget_counts else naflex_loader(a.shards, a.index)
    log, collate = KeyLog(a.keys_dir), Siglip2Collator()

    def collator(batch):
        log.write(batch.keys)
        return collate(batch)

    model = tiny_siglip2()
    os.makedirs(a.keys_dir, exist_ok=True)
    trainer = ShardTrainer(
        model=model, args=args, train_loader=loader, collator=collator,
        callbacks=[Log(os.path.join(a.keys_dir, "loss.jsonl"), model)],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
    end_worker()
