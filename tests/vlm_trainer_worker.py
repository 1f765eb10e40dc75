"""One rank of transformers.Trainer on the interleaved kind (run by test_vlm_trainer.py under
torchrun): a tiny Qwen2VLForConditionalGeneration from a config (nothing downloaded) trains on
packed interleaved documents of real photos and captions through ShardTrainer and
QwenVLCollator, checkpointing every --save-steps up to --max-steps, optionally resuming. Each
batch is logged (a hash of its ids and pixels, videos' included) as the collator hands it over,
with its image rows, videos and video rows (test_vlm_trainer_video.py), and each step's loss."""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import tokenizers
import torch
from integration_support import end_worker
from qwen_reference import tiny_qwen2_vl_config
from shardstream import InterleavedLoader, QwenVLCollator
from shardstream.integrations.hf import ShardTrainer
from text_trainer_worker import LossLog
from transformers import Qwen2VLForConditionalGeneration, TrainingArguments

PAD = 2  # "<pad>" of the tokenizer fixture


def batch_hash(batch) -> str:
    h = hashlib.sha1(batch.input_ids.numpy().tobytes())
    h.update(batch.pixel_values.numpy().tobytes())
    if batch.pixel_values_videos is not None:  # a batch without videos hashes as before videos
        h.update(batch.pixel_values_videos.numpy().tobytes())
        h.update(batch.video_grid_thw.numpy().tobytes())
    return h.hexdigest()[:16]


def batch_vision(batch) -> dict[str, int]:
    """The rows of a batch's ``pixel_values``, and its videos and their rows of
    ``pixel_values_videos``."""
    videos = batch.pixel_values_videos
    return {
        "image_rows": len(batch.pixel_values),
        "videos": 0 if videos is None else len(batch.video_grid_thw),
        "video_rows": 0 if videos is None else len(videos),
    }


def tiny_qwen2_vl(
    vocab: int, vision_ids: tuple[int, int, int], video_id: int | None = None
) -> Qwen2VLForConditionalGeneration:
    config = tiny_qwen2_vl_config(vocab, vision_ids, layers=1, pad_id=PAD)
    if video_id is not None:  # the loader's <|video_pad|> (the config's default is Qwen's own id)
        config.video_token_id = video_id
    return Qwen2VLForConditionalGeneration(config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--counts", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--save-steps", type=int, required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = InterleavedLoader(a.counts, pad_token_id=PAD, threads=1)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, save_strategy="steps", save_steps=a.save_steps,
        per_device_train_batch_size=loader.batch_size, learning_rate=3e-2, use_cpu=True,
        ddp_backend="gloo", report_to=[], logging_steps=1, disable_tqdm=True, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    os.makedirs(a.log_dir, exist_ok=True)
    log_path = os.path.join(a.log_dir, f"batches-rank{loader.rank}.jsonl")
    vision_log = os.path.join(a.log_dir, f"vision-rank{loader.rank}.jsonl")
    collate = QwenVLCollator()

    def collator(batch):
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(batch_hash(batch)) + "\n")
        with open(vision_log, "a", encoding="utf-8") as f:
            f.write(json.dumps(batch_vision(batch)) + "\n")
        return collate(batch)

    vocab = tokenizers.Tokenizer.from_file(loader.counts.tokenizer).get_vocab_size()
    model = tiny_qwen2_vl(vocab, loader.vision_token_ids, loader.video_token_id)
    trainer = ShardTrainer(
        model=model, args=args, train_loader=loader, collator=collator,
        callbacks=[LossLog(os.path.join(a.log_dir, "loss.jsonl"))], num_workers=a.workers,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
    end_worker()
