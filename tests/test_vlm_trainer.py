"""A VLM trains on the interleaved kind through transformers.Trainer (ShardTrainer and
QwenVLCollator) on 2 CPU ranks under torchrun, each reading through 2 DataLoader workers: a tiny
Qwen2VLForConditionalGeneration from a config, on packed documents of real photos and captions.
Its loss falls; stopped at step n with a checkpoint, resume_from_checkpoint trains on exactly the
uninterrupted run's batches from step n+1."""

from __future__ import annotations

import json

import pytest
from integration_support import launch
from interleaved_corpus import real_documents, write_obelics_parquet
from qwen_reference import EOS, write_tokenizer_json
from shardstream import InterleavedLoader, QwenVL, count_interleaved
from vlm_trainer_worker import PAD, batch_hash

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STOP, STEPS = 3, 8
WORKERS = 2


def logged(directory, rank: int) -> list[str]:
    with open(directory / f"batches-rank{rank}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-trainer")
    docs = real_documents(64, seed=5)
    files = [write_obelics_parquet(str(root / f"part-{i}.parquet"), docs[i::2], 8) for i in range(2)]
    tokenizer = write_tokenizer_json(str(root / "tokenizer.json"))
    counts_path = str(root / "counts.json")
    spec = QwenVL(max_pixels=28 * 28 * 64)
    counts = count_interleaved(
        files, tokenizer=tokenizer, spec=spec, seq_len=512, batch_size=2, eos_token=EOS, output=counts_path
    )
    assert counts.total_batches >= 2 * STEPS

    def train(name, *, max_steps, resume=None):
        args = [
            "--counts", counts_path, "--output-dir", str(root / name / "out"), "--log-dir",
            str(root / name / "log"), "--max-steps", str(max_steps), "--save-steps", str(STOP),
            "--workers", str(WORKERS),
        ]  # fmt: skip
        if resume is not None:
            args += ["--resume", str(resume)]
        run = launch("vlm_trainer_worker.py", args, nproc=2, timeout=300)
        assert run.returncode == 0, f"{name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        return root / name

    def reference(rank: int) -> list[str]:
        loader = InterleavedLoader(counts, pad_token_id=PAD, rank=rank, world_size=2)
        return [batch_hash(b) for b in loader.dataloader(WORKERS)]

    full = [reference(r) for r in range(2)]
    uninterrupted = train("full", max_steps=STEPS)
    stopped = train("stopped", max_steps=STOP)
    resumed = train("resumed", max_steps=STEPS, resume=stopped / "out" / f"checkpoint-{STOP}")
    return {"full": full, "uninterrupted": uninterrupted, "stopped": stopped, "resumed": resumed}


def test_the_loss_falls(runs):
    with open(runs["uninterrupted"] / "log" / "loss.jsonl", encoding="utf-8") as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.5, losses


def test_resume_from_checkpoint_trains_on_the_uninterrupted_batches(runs):
    for rank in range(2):
        full = runs["full"][rank]
        assert logged(runs["uninterrupted"] / "log", rank) == full[:STEPS]
        assert logged(runs["stopped"] / "log", rank) == full[:STOP]
        assert logged(runs["resumed"] / "log", rank) == full[STOP:STEPS], f"rank {rank}"
