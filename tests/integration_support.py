"""Helpers for the framework adapter tests (no tests here): the real-photo shards they train on,
torchrun / launcher runs of their worker scripts, and the per-rank key logs the workers write."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from corpus import write_shards
from servers import free_ports
from shardstream.index import build_index, write_index
from train_support import run_bounded

TESTS = Path(__file__).resolve().parent
SEED = 7  # the loaders' seed, in the workers and in the reference runs
COUNTS = [13, 9, 11, 7]  # 40 real photos: 5 steps of 4 per rank on 2 ranks, 10 on one
# The drill switch of test_drills.py: with it, each framework's stop/resume key-equality scenario
# (open_clip_train, HF Trainer, accelerate, Lightning) runs 5 times; the suite runs it once.
LONG_DRILLS = os.environ.get("SHARDSTREAM_DRILLS_LONG", "") not in ("", "0")
REPETITIONS = list(range(5 if LONG_DRILLS else 1))


def end_worker() -> NoReturn:
    """Ends a finished DDP worker as ``shardstream.train`` ends its own: the ranks leave the
    process group together, then the process exits without finalizing the interpreter (why:
    ``shardstream.train.dist.exit_process``; the frameworks leave the group up, and a rank then
    aborted about 1 in 40 two-rank Trainer runs here). Cycles are collected first, so that a
    torch DataLoader's worker processes are shut down by their iterator."""
    import torch.distributed as dist
    from shardstream.train.dist import exit_process

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    exit_process(0)


def repetition_id(repetition: int) -> str:
    return f"rep{repetition}"


def photo_dataset(directory: Path) -> tuple[str, str, list[str]]:
    """('::'-joined shard paths, index path, every sample's key)."""
    paths, keys = write_shards(directory, COUNTS, seed=500)
    return "::".join(paths), write_index(build_index(paths), str(directory / "index.json")), keys


def make_loader(
    shards: str, index: str, *, seed: int = SEED, rank: int | None = None, world: int | None = None, **kw
):
    """The loader every adapter test trains with (rank and world size from torchrun's environment
    unless given): the reference runs in the tests make the same one."""
    from shardstream import ShardLoader

    return ShardLoader(
        shards, index=index, batch_size=4, image_size=32, seed=seed, shuffle_buffer=6, threads=1,
        rank=rank, world_size=world, **kw,
    )  # fmt: skip


def reference_keys(
    shards: str, index: str, *, seed: int = SEED, world: int, epochs: int
) -> list[list[list[str]]]:
    """Per rank, the keys of every batch of an uninterrupted run of ``epochs`` epochs (the
    loader's order is a pure function of seed, epoch and world size: test_exact_epochs.py)."""
    per_rank = []
    for rank in range(world):
        loader = make_loader(shards, index, seed=seed, rank=rank, world=world)
        batches = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            batches += [list(b.keys) for b in loader]
        per_rank.append(batches)
    return per_rank


def launch(script: str, args: list[str], *, nproc: int, timeout: float = 240, launcher: str = "torchrun"):
    """``script`` on ``nproc`` CPU processes (gloo, loopback) under torchrun or ``accelerate
    launch``; the whole process tree is killed on timeout. Retried on a port taken meanwhile."""
    for attempt in range(3):
        (port,) = free_ports(1)
        if launcher == "accelerate":
            # --multi_gpu is accelerate's torchrun launcher (its --cpu runs one process without
            # mpirun); the worker's Accelerator(cpu=True) then takes the gloo backend.
            head = [
                sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines=1",
                f"--num_processes={nproc}", "--main_process_ip=127.0.0.1", f"--main_process_port={port}",
                "--mixed_precision=no", "--dynamo_backend=no",
            ]  # fmt: skip
        else:
            head = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
                "--master-addr=127.0.0.1", f"--master-port={port}",
            ]  # fmt: skip
        run = run_bounded([*head, str(TESTS / script), *args], timeout=timeout, extra_path=str(TESTS))
        if run.returncode != 0 and "address already in use" in run.stderr.lower() and attempt < 2:
            continue
        return run
    raise AssertionError("unreachable")


def key_log(directory: Path, rank: int) -> list[list[str]]:
    """The batches' keys that rank ``rank`` of a worker run trained on, in order."""
    path = Path(directory) / f"keys-rank{rank}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def epoch_log(directory: Path, rank: int) -> list[int]:
    """The epoch the loader was reading at each of ``key_log(directory, rank)``'s batches."""
    path = Path(directory) / f"epochs-rank{rank}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class KeyLog:
    """Appends each batch's keys to ``DIR/keys-rank{RANK}.jsonl`` (and, when the worker says,
    the loader's epoch to ``DIR/epochs-rank{RANK}.jsonl``), one line per batch, flushed (a worker
    killed mid-run leaves every line it wrote)."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        self.file = open(os.path.join(directory, f"keys-rank{rank}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
        self.epochs = open(os.path.join(directory, f"epochs-rank{rank}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115

    def write(self, keys: list[str], epoch: int | None = None) -> None:
        if epoch is not None:
            self.epochs.write(json.dumps(int(epoch)) + "\n")
            self.epochs.flush()
        self.file.write(json.dumps(list(keys)) + "\n")
        self.file.flush()


def tiny_clip_config():
    """A CLIPConfig small enough for a CPU step in milliseconds, with CLIP's BPE vocabulary (the
    loader tokenizes with open_clip's ViT-B-32 tokenizer: 77 tokens, end of text 49407)."""
    from transformers import CLIPConfig

    return CLIPConfig(
        text_config=dict(
            vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=77, bos_token_id=49406, eos_token_id=49407,
            pad_token_id=0,
        ),
        vision_config=dict(
            image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=16,
    )  # fmt: skip
