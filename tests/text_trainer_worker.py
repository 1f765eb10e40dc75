"""One rank of transformers.Trainer on the packed text kind (run by test_text_trainer.py under
torchrun): a tiny GPT-2 from a config (nothing downloaded) trains on token rows of real text
through ShardTrainer and CausalLMCollator, checkpointing every --save-steps up to --max-steps,
optionally resuming. Each batch is logged (a hash of its ids) as the collator hands it over, and
each step's loss."""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from integration_support import end_worker
from shardstream import TextLoader
from shardstream.integrations.hf import CausalLMCollator, ShardTrainer
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

BATCH, SEQ_LEN = 4, 64


def batch_hash(ids) -> str:
    return hashlib.sha1(torch.as_tensor(ids).to(torch.int64).numpy().tobytes()).hexdigest()[:16]


class LossLog(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if logs and "loss" in logs and state.is_world_process_zero:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--counts", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--save-steps", type=int, required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, save_strategy="steps", save_steps=a.save_steps,
        per_device_train_batch_size=BATCH, learning_rate=1e-2, use_cpu=True, ddp_backend="gloo",
        report_to=[], logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    loader = TextLoader(a.counts, batch_size=BATCH, seq_len=SEQ_LEN, boundaries=True, threads=1)
    os.makedirs(a.log_dir, exist_ok=True)
    log_path = os.path.join(a.log_dir, f"batches-rank{loader.rank}.jsonl")
    collate = CausalLMCollator()

    def collator(batch):
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(batch_hash(batch.input_ids)) + "\n")
        return collate(batch)

    config = GPT2Config(vocab_size=a.vocab, n_positions=SEQ_LEN, n_embd=32, n_layer=1, n_head=2)
    trainer = ShardTrainer(
        model=GPT2LMHeadModel(config), args=args, train_loader=loader, collator=collator,
        callbacks=[LossLog(os.path.join(a.log_dir, "loss.jsonl"))], num_workers=a.workers,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
    end_worker()
