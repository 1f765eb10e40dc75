"""The StatefulDataLoader contract (torchdata's, which accelerate and Lightning look for) of
ShardLoader with no workers and of loader.dataloader(K): states round-trip through torch.save and
JSON, save/load cycles inside an epoch do not drift, set_epoch after a load keeps the position,
the pass after a resumed one reads a whole epoch, and the framework view's len() is a whole epoch.
Also: importing shardstream imports no framework, and a missing one is one line naming the extra."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import shardstream
import torch
from corpus import write_shards
from shardstream.index import build_index, write_index
from shardstream.integrations._stateful import FrameworkLoader

COUNTS = [9, 7, 11, 5]  # 32 samples: 8 batches of 4 on one rank, 4 per rank on two


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("protocol")
    paths, keys = write_shards(d, COUNTS, seed=300)
    return paths, keys, write_index(build_index(paths), str(d / "index.json"))


def make(dataset, *, rank=0, world=1, seed=11):
    paths, _, index = dataset
    return shardstream.ShardLoader(
        paths, index=index, batch_size=4, image_size=32, seed=seed, rank=rank, world_size=world,
        shuffle_buffer=5, threads=1,
    )  # fmt: skip


def source(loader, workers):
    return loader.dataloader(num_workers=workers) if workers else loader


def keys_of(batches):
    return [list(b.keys) for b in batches]


def through_torch_save(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_round_trips_through_torch_save_and_json(dataset, workers):
    full = keys_of(source(make(dataset), workers))
    loader = make(dataset)
    stateful = source(loader, workers)
    it = iter(stateful)
    first = [list(next(it).keys) for _ in range(3)]
    state = stateful.state_dict()
    del it  # shuts the DataLoader's workers down
    assert json.loads(json.dumps(state)) == state
    assert through_torch_save(state) == state
    for copy in (json.loads(json.dumps(state)), through_torch_save(state)):
        resumed = make(dataset)
        rest = source(resumed, workers)
        rest.load_state_dict(copy)
        assert first + keys_of(rest) == full


@pytest.mark.parametrize("workers", [0, 2])
def test_repeated_save_load_cycles_within_an_epoch_do_not_drift(dataset, workers):
    """A checkpoint every 2 batches, each resumed in a fresh loader (and process state), gives the
    uninterrupted epoch's keys; a state saved right after a load, before any batch, is the same
    position (checkpointing twice at one step loses nothing)."""
    full = keys_of(source(make(dataset), workers))
    seen, state = [], None
    while True:
        stateful = source(make(dataset), workers)
        if state is not None:
            stateful.load_state_dict(state)
            again = stateful.state_dict()
            stateful = source(make(dataset), workers)
            stateful.load_state_dict(through_torch_save(again))
        it = iter(stateful)
        got = []
        for batch in it:
            got.append(list(batch.keys))
            if len(got) == 2:
                break
        state = json.loads(json.dumps(stateful.state_dict()))
        del it
        seen += got
        if len(got) < 2 or len(seen) == len(full):
            break
    assert seen == full


def test_set_epoch_after_load_keeps_the_position_and_the_next_pass_is_a_whole_epoch(dataset):
    loader = make(dataset)
    loader.set_epoch(1)
    epoch1 = keys_of(loader)
    it = iter(loader)
    head = [list(next(it).keys) for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed = make(dataset)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # as HF Trainer and accelerate loops do after restoring
    assert (len(resumed), resumed.batches_per_epoch) == (len(epoch1) - 3, len(epoch1))
    assert head + keys_of(resumed) == epoch1
    assert keys_of(resumed) == epoch1, "once the resumed epoch was read to its end, a pass reads it whole"
    other = make(dataset)
    other.load_state_dict(state)
    other.set_epoch(2)
    assert keys_of(other) == keys_of(_at_epoch(make(dataset), 2)), "another epoch drops the position"


def _at_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("workers", [0, 2])
def test_framework_view_counts_the_epochs_steps_and_resumes_elastically(dataset, workers):
    """States taken on 2 ranks after 1 batch, loaded on 1 rank (with or without workers): the rest
    of the epoch holds every sample not yet seen exactly once; len() counts the epoch's steps as
    a framework does: the one done before, then those left."""
    _, keys, _ = dataset
    seen, state = [], None
    for rank in range(2):
        view = FrameworkLoader(make(dataset, rank=rank, world=2), gather=False)
        assert len(view) == 4
        it = iter(view)
        seen += list(next(it).keys)
        state = view.state_dict()
        del it
    resumed = FrameworkLoader(make(dataset), num_workers=workers)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    assert len(resumed) == 1 + 6, "len(): the step done at W=2, then the rest of the epoch at W=1"
    rest = [k for b in resumed for k in b.keys]
    assert len(rest) == len(keys) - len(seen)
    assert sorted(seen + rest) == sorted(keys), "each sample exactly once over the two world sizes"


def test_importing_shardstream_imports_no_framework():
    code = (
        "import sys, shardstream, shardstream.integrations, shardstream.loader\n"
        "loaded = [m for m in ('transformers', 'accelerate', 'lightning', 'torchdata') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("adapter", "framework", "extra"),
    [
        ("hf", "transformers", "hf"),
        ("accelerate", "accelerate", "hf"),
        ("lightning", "lightning", "lightning"),
    ],
)
def test_a_missing_framework_is_one_line_naming_the_extra(adapter, framework, extra):
    code = (
        f"import sys\nsys.modules[{framework!r}] = None  # as if not installed\n"
        f"import shardstream.integrations.{adapter}\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        f"shardstream.integrations.MissingFrameworkError: shardstream.integrations.{adapter} needs "
        f"{framework}: pip install 'shardstream[{extra}]'"
    )
