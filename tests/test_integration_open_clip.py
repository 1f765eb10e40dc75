"""open_clip_train's own ``main`` through ``shardstream.integrations.open_clip``: the real
open_clip_train 3.3 (from open_clip_torch) training shardstream-tiny on 2 CPU ranks (torchrun,
gloo, its DDP wrap patched for the CPU) over demo shards with real photos.

* its own logs, checkpoints and validation results are written, validation reads our held-out
  loader, and every epoch is exactly once across the ranks (zero-shot is open_clip_train's
  ImageNet-only path: without ``--imagenet-val`` it skips, and these tests give none);
* a run killed after a mid-epoch checkpoint and restarted with ``--resume latest`` trains on the
  uninterrupted run's keys, batch for batch, and ends with bit-identical weights;
* the data flags map (mixtures from ``--dataset-resampled`` and upsampling factors) or are
  refused with one line; images and tokens are what open_clip's own preprocessing gives.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from integration_support import REPETITIONS, repetition_id
from servers import free_ports
from train_support import (
    ROOT,
    SmallDataset,
    build_small_dataset,
    kill_tree,
    run_bounded,
    started,
    torchrun,
    torchrun_command,
    train_env,
)

MODULE = "shardstream.integrations.open_clip"
EVERY = 4  # mid-epoch checkpoint every 4 of an epoch's 8 steps (128 samples / (8 x 2 ranks))
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SmallDataset:
    return build_small_dataset(tmp_path_factory.mktemp("open-clip-data"))  # 128 train, 32 held out


def open_clip_args(data: SmallDataset, logs: Path, name: str, keys: Path, *extra: str) -> list[str]:
    # "--" first: torchrun (torch >= 2.10) would take open_clip_train's --logs for its --logs-specs.
    return [
        "--", "--train-data", data.train, "--train-index", data.train_index,
        "--val-data", data.heldout, "--val-index", data.heldout_index,
        "--model", "shardstream-tiny", "--device", "cpu", "--dist-backend", "gloo", "--precision", "fp32",
        "--batch-size", "8", "--epochs", "2", "--workers", "1", "--lr", "1e-3", "--warmup", "2",
        "--seed", "0", "--logs", str(logs), "--name", name, "--log-every-n-steps", "1",
        "--save-every-n-steps", str(EVERY), "--sample-keys-log", str(keys), "--shuffle-buffer", "16",
        *extra,
    ]  # fmt: skip


def key_records(folder: Path, rank: int) -> list[dict]:
    with open(folder / f"rank-{rank}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def position(record: dict) -> tuple[int, int]:
    return record["epoch"], record["batch"]


@pytest.fixture(scope="module")
def uninterrupted(dataset: SmallDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("open-clip-whole")
    run = torchrun(
        open_clip_args(dataset, root / "logs", "whole", root / "keys"), module=MODULE, timeout=RUN_TIMEOUT
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return root


@pytest.mark.slow
def test_open_clip_train_writes_its_logs_checkpoints_and_validation(
    uninterrupted: Path, dataset: SmallDataset
) -> None:
    from shardstream import read_samples

    run = uninterrupted / "logs" / "whole"
    log = (run / "out.log").read_text(encoding="utf-8")
    assert "shardstream: train data exact epochs over the index; 8 batches of 8 per rank" in log
    assert "Train Epoch: 1 [128/128 (100%)]" in log
    assert (run / "params.txt").read_text(encoding="utf-8").count("train_data: ") == 1
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == [
        "epoch_0_step_4.pt", "epoch_1.pt", "epoch_1_step_4.pt", "epoch_2.pt",
    ]  # fmt: skip
    mid = torch.load(checkpoints / "epoch_1_step_4.pt", map_location="cpu", weights_only=False)
    assert mid["epoch"] == 1 and mid["name"] == "whole"
    assert {"state_dict", "optimizer"} <= set(mid) and next(iter(mid["state_dict"])).startswith("module.")
    assert (mid["shardstream"]["epoch"], mid["shardstream"]["batches"]) == (1, 4)
    assert mid["shardstream"]["loader"]["epoch"] == 1

    # Validation ran on every held-out sample (rank 0 evaluates alone, as open_clip_train does);
    # zero-shot is ImageNet's only and, without --imagenet-val, skipped.
    results = [json.loads(line) for line in (checkpoints / "results.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in results] == [1, 2]
    heldout = sum(1 for _ in read_samples(dataset.heldout))
    for r in results:
        assert r["num_samples"] == heldout == 32
        assert 0 < r["clip_val_loss"] < 10 and 0 <= r["image_to_text_R@10"] <= 1
        assert not any("zeroshot" in k for k in r)

    # Exact epochs: both ranks together read every training sample once per epoch, in a new order.
    everything = sorted(s["__key__"] for s in read_samples(dataset.train))
    orders = []
    for epoch in (0, 1):
        records = [key_records(uninterrupted / "keys", rank) for rank in (0, 1)]
        per_rank = [[k for r in mine if r["epoch"] == epoch for k in r["keys"]] for mine in records]
        assert sorted(per_rank[0] + per_rank[1]) == everything
        orders.append(per_rank[0])
    assert orders[0] != orders[1]


@pytest.mark.slow
@pytest.mark.parametrize("repetition", REPETITIONS, ids=repetition_id)
def test_resume_latest_after_a_kill_continues_with_the_uninterrupted_keys(
    uninterrupted: Path, dataset: SmallDataset, tmp_path: Path, repetition: int
) -> None:
    logs = tmp_path / "logs"
    (port,) = free_ports(1)
    first = torchrun_command(
        open_clip_args(dataset, logs, "run", tmp_path / "keys-first"), port=port, module=MODULE
    )
    saved = logs / "run" / "checkpoints" / "epoch_0_step_4.pt"
    with started(first) as proc:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not saved.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert saved.exists() and proc.poll() is None, "no mid-epoch checkpoint while the run was going"
        kill_tree(proc.pid)  # SIGKILL: torchrun and both ranks, mid-epoch
    assert not (logs / "run" / "checkpoints" / "epoch_2.pt").exists()

    resumed = torchrun(
        open_clip_args(dataset, logs, "run", tmp_path / "keys-resumed", "--resume", "latest"),
        module=MODULE,
        timeout=RUN_TIMEOUT,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-6000:]
    log = (logs / "run" / "out.log").read_text(encoding="utf-8")
    assert (
        "=> resuming checkpoint" in log and "_step_" in log.split("=> resuming checkpoint")[1].splitlines()[0]
    )

    for rank in (0, 1):
        whole = key_records(uninterrupted / "keys", rank)
        before = key_records(tmp_path / "keys-first", rank)
        after = key_records(tmp_path / "keys-resumed", rank)
        start = position(after[0])
        assert start[1] % EVERY == 0 and start > (0, 0), f"resumed at {start}: not a mid-epoch checkpoint"
        assert after == [r for r in whole if position(r) >= start]
        assert [r for r in before if position(r) < start] == [r for r in whole if position(r) < start]

    # The schedule, optimizer and model continued too: the same weights, bit for bit.
    theirs = torch.load(uninterrupted / "logs" / "whole" / "checkpoints" / "epoch_2.pt", weights_only=False)
    ours = torch.load(logs / "run" / "checkpoints" / "epoch_2.pt", weights_only=False)
    assert ours["state_dict"].keys() == theirs["state_dict"].keys()
    for name, value in theirs["state_dict"].items():
        assert torch.equal(ours["state_dict"][name], value), name


@pytest.mark.slow
def test_resume_on_one_rank_reads_the_rest_of_the_epoch_once(
    uninterrupted: Path, dataset: SmallDataset, tmp_path: Path
) -> None:
    """The 2-rank run's mid-epoch checkpoint, resumed by one process: the loader re-plans the
    rest of the epoch onto one rank, so it reads exactly the samples the two ranks had not."""
    checkpoint = uninterrupted / "logs" / "whole" / "checkpoints" / "epoch_0_step_4.pt"
    argv = open_clip_args(dataset, tmp_path / "logs", "one", tmp_path / "keys", "--resume", str(checkpoint))
    argv[argv.index("--epochs") + 1] = "1"
    run = run_bounded([sys.executable, "-m", MODULE, *argv[1:]], timeout=RUN_TIMEOUT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    whole = [r for rank in (0, 1) for r in key_records(uninterrupted / "keys", rank) if r["epoch"] == 0]
    trained = {k for r in whole if r["batch"] < 4 for k in r["keys"]}
    rest = {k for r in whole if r["batch"] >= 4 for k in r["keys"]}
    resumed = key_records(tmp_path / "keys", 0)
    keys = [k for r in resumed for k in r["keys"]]
    assert [r["batch"] for r in resumed] == list(range(4, 12))  # 64 samples left, 8 batches of 8
    assert len(keys) == len(set(keys)) == 64 and set(keys) == rest and not set(keys) & trained


def open_clip_namespace(*argv: str) -> object:
    """open_clip_train's own parsed arguments, as its main sees them after init_distributed_device."""
    from open_clip_train.params import parse_args

    args = parse_args(["--model", "shardstream-tiny", "--device", "cpu", "--batch-size", "8", *argv])
    args.rank, args.world_size, args.distributed = 0, 1, False
    return args


def test_images_and_tokens_are_what_open_clip_preprocessing_gives(dataset: SmallDataset) -> None:
    import open_clip
    from PIL import Image
    from shardstream import read_samples
    from shardstream.integrations.open_clip_data import AdapterOptions, get_data
    from shardstream.train.model import register_model_configs

    register_model_configs()
    _, train_transform, val_transform = open_clip.create_model_and_transforms("shardstream-tiny")
    tokenizer = open_clip.get_tokenizer("shardstream-tiny")
    args = open_clip_namespace("--train-data", dataset.train, "--val-data", dataset.heldout, "--workers", "1")
    options = AdapterOptions(train_index=dataset.train_index, val_index=dataset.heldout_index)
    data = get_data(args, (train_transform, val_transform), 0, tokenizer, options, None)
    train, val = data["train"].dataloader, data["val"].dataloader
    assert (train.num_batches, train.num_samples) == (16, 128)
    assert (val.num_batches, val.num_samples) == (4, 32)

    samples = {s["__key__"]: s for s in read_samples(dataset.heldout)}
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(1, 3, 1, 1)
    seen = 0
    for (images, tokens), raw in zip(val, val.loader, strict=True):  # two passes, the same order
        assert torch.equal(tokens, tokenizer(raw.texts))  # token-identical to open_clip's tokenizer
        assert images.dtype == torch.float32
        assert torch.allclose(images, (raw.images.float() / 255 - mean) / std, atol=1e-6)
        pil = torch.stack([val_transform(Image.open(io.BytesIO(samples[k]["jpg"]))) for k in raw.keys])
        # Our decode and resize, not Pillow's bicubic: close, not equal (normalised units, std ~0.27).
        assert (images - pil).abs().mean() < 0.05
        seen += len(raw.keys)
    assert seen == 32


def two_sources(dataset: SmallDataset, folder: Path) -> tuple[list[list[str]], list[str], list[int]]:
    """The demo's four training shards as two datasets (80 and 48 samples), each indexed."""
    from shardstream.index import build_index, write_index

    shards = dataset.train.split("::")
    parts, indexes, sizes = [shards[:2], shards[2:]], [], []
    for i, part in enumerate(parts):
        index = build_index(part)
        sizes.append(index.num_valid)
        indexes.append(write_index(index, str(folder / f"source{i}.index")))
    return parts, indexes, sizes


def test_resampled_with_upsampling_factors_is_an_exact_mixture(dataset: SmallDataset, tmp_path: Path) -> None:
    from shardstream import ShardLoader
    from shardstream.integrations.open_clip_data import train_selection

    parts, indexes, sizes = two_sources(dataset, tmp_path)
    # One brace pattern per source, as open_clip_train's --train-data 'A::B' has them.
    train_data = "::".join("{" + ",".join(part) + "}" for part in parts)
    args = open_clip_namespace(
        "--train-data", train_data, "--dataset-resampled", "--train-data-upsampling-factors", "1::3"
    )
    selection = train_selection(args, "::".join(indexes))
    assert selection.urls is None and selection.sources is not None
    assert [s.weight for s in selection.sources] == [sizes[0], 3.0 * sizes[1]]
    loader = ShardLoader(
        sources=selection.sources, batch_size=8, image_size=32, threads=1, rank=0, world_size=1
    )
    counts = {name: 0 for name in ("source0", "source1")}
    for _ in loader:
        pass
    counts.update(loader.stats["samples_by_source"])
    total = sizes[0] + sizes[1]
    share = 3 * sizes[1] / (sizes[0] + 3 * sizes[1])
    assert sum(counts.values()) == total  # the epoch: all sources' samples, in the factors' proportion
    assert abs(counts["source1"] - share * total) <= 1


def test_train_num_samples_is_the_epoch_length(dataset: SmallDataset) -> None:
    from shardstream import ShardLoader
    from shardstream.integrations.open_clip_data import train_selection

    args = open_clip_namespace(
        "--train-data", dataset.train, "--dataset-resampled", "--train-num-samples", "64"
    )
    selection = train_selection(args, dataset.train_index)
    assert selection.samples_per_epoch == 64 and selection.sources is not None
    loader = ShardLoader(
        sources=selection.sources, samples_per_epoch=64, batch_size=8, image_size=32, threads=1,
        rank=0, world_size=1,
    )  # fmt: skip
    epochs = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        epochs.append([k for batch in loader for k in batch.keys])
    # 64 of the 128 samples per epoch, none twice, and the next epoch continues with the others.
    assert [len(e) for e in epochs] == [64, 64] and len(set(epochs[0] + epochs[1])) == 128


@pytest.mark.parametrize(
    ("argv", "index", "message"),
    [
        (["--train-data-upsampling-factors", "1::2"], "i.index",
         "--train-data-upsampling-factors needs --dataset-resampled, as in open_clip_train"),
        (["--dataset-resampled"], None,
         "--dataset-resampled maps onto an exact mixture epoch, which needs --train-index"),
        ([], None, "without --train-index, --train-num-samples is needed"),
        (["--dataset-resampled"], "a.index::b.index::c.index",
         "--train-index has 3 '::' parts and --train-data 2"),
        (["--dataset-resampled", "--train-data-upsampling-factors", "1::2"], "one.index",
         "--train-data-upsampling-factors weighs sources: give one index per '::' part"),
    ],
)  # fmt: skip
def test_unmappable_data_flags_are_refused_with_one_line(
    argv: list[str], index: str | None, message: str
) -> None:
    from shardstream.integrations.open_clip_data import OpenClipUsageError, train_selection

    args = open_clip_namespace("--train-data", "a/{0..3}.tar::b/{0..3}.tar", *argv)
    with pytest.raises(OpenClipUsageError, match="^" + re.escape(message)):
        train_selection(args, index)


def test_the_command_refuses_an_augmentation_it_does_not_reproduce(
    dataset: SmallDataset, tmp_path: Path
) -> None:
    cmd = [
        sys.executable, "-m", MODULE, "--train-data", dataset.train, "--train-index", dataset.train_index,
        "--model", "shardstream-tiny", "--device", "cpu", "--logs", str(tmp_path),
        "--aug-cfg", "color_jitter=0.4",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2  # refused before torch or the model loads: this one line only
    assert done.stderr.strip() == (
        f"{MODULE}: --aug-cfg color_jitter: open_clip applies it in the PIL transforms the adapter "
        "replaces; only scale=(a, b), the random crop's range, is supported"
    )
