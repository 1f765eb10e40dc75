"""One rank of transformers.Trainer through shardstream.integrations.hf (run by
test_integration_hf.py under torchrun): a tiny CLIPModel from a config on real-photo shards,
checkpointing every --save-steps, up to --max-steps (else for --epochs), optionally resuming a
checkpoint. Each batch's keys and the loader's epoch are logged as the collator hands it to the step."""

from __future__ import annotations

import argparse

import torch
from integration_support import KeyLog, end_worker, make_loader, tiny_clip_config
from shardstream.integrations.hf import CLIPCollator, ShardTrainer
from transformers import CLIPModel, TrainingArguments


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--keys-dir", required=True)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument(
        "--epochs", type=float, default=3.0, help="num_train_epochs, when --max-steps is not given"
    )
    p.add_argument("--save-steps", type=int, required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, num_train_epochs=a.epochs, save_strategy="steps",
        save_steps=a.save_steps,
        per_device_train_batch_size=4, learning_rate=1e-3, use_cpu=True, ddp_backend="gloo", report_to=[],
        logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    loader = make_loader(a.shards, a.index, tokenizer="ViT-B-32")
    log, collate = KeyLog(a.keys_dir), CLIPCollator()

    def collator(batch):
        log.write(batch.keys, loader.epoch)
        return collate(batch)

    trainer = ShardTrainer(
        model=CLIPModel(tiny_clip_config()), args=args, train_loader=loader, collator=collator,
        num_workers=a.workers,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
    end_worker()
