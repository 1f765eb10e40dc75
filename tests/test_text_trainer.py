"""A causal LM trains on the packed text kind through transformers.Trainer (ShardTrainer and
CausalLMCollator) on 2 CPU ranks under torchrun, each reading through 2 DataLoader workers: a tiny
GPT-2 from a config, on token rows of real text (standard library sources and the real captions).
Its loss falls; stopped at step n with a checkpoint, resume_from_checkpoint trains on exactly the
uninterrupted run's rows from step n+1."""

from __future__ import annotations

import json

import pytest
from integration_support import launch
from shardstream import TextLoader, count_tokens
from text_corpus import GPT2_STYLE, documents, write_parquet_corpus
from text_trainer_worker import BATCH, SEQ_LEN, batch_hash

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STOP, STEPS = 3, 8
WORKERS = 2


def logged(directory, rank: int) -> list[str]:
    with open(directory / f"batches-rank{rank}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-trainer")
    paths = write_parquet_corpus(str(root / "data"), documents(20)[:400], files=2, rows_per_group=50)
    counts_path = str(root / "counts.json")
    counts = count_tokens(paths, tokenizer=GPT2_STYLE, output=counts_path)
    import tokenizers

    vocab = tokenizers.Tokenizer.from_file(GPT2_STYLE).get_vocab_size()

    def train(name, *, nproc, max_steps, resume=None):
        args = [
            "--counts", counts_path, "--vocab", str(vocab), "--output-dir", str(root / name / "out"),
            "--log-dir", str(root / name / "log"), "--max-steps", str(max_steps), "--save-steps", str(STOP),
            "--workers", str(WORKERS),
        ]  # fmt: skip
        if resume is not None:
            args += ["--resume", str(resume)]
        run = launch("text_trainer_worker.py", args, nproc=nproc, timeout=300)
        assert run.returncode == 0, f"{name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        return root / name

    def reference(rank: int) -> list[str]:
        loader = TextLoader(
            counts, batch_size=BATCH, seq_len=SEQ_LEN, rank=rank, world_size=2, boundaries=True
        )
        return [batch_hash(b.input_ids) for b in loader.dataloader(WORKERS)]

    full = [reference(r) for r in range(2)]
    uninterrupted = train("full", nproc=2, max_steps=STEPS)
    stopped = train("stopped", nproc=2, max_steps=STOP)
    checkpoint = stopped / "out" / f"checkpoint-{STOP}"
    resumed = train("resumed", nproc=2, max_steps=STEPS, resume=checkpoint)
    return {"full": full, "uninterrupted": uninterrupted, "stopped": stopped, "resumed": resumed}


def test_the_loss_falls(runs):
    with open(runs["uninterrupted"] / "log" / "loss.jsonl", encoding="utf-8") as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.5, losses


def test_resume_from_checkpoint_trains_on_the_uninterrupted_rows(runs):
    for rank in range(2):
        full = runs["full"][rank]
        assert logged(runs["uninterrupted"] / "log", rank) == full[:STEPS]
        assert logged(runs["stopped"] / "log", rank) == full[:STOP]
        assert logged(runs["resumed"] / "log", rank) == full[STOP:STEPS], f"rank {rank}"
