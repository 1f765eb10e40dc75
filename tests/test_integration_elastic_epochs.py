"""Every framework adapter after a resume onto another world size: Lightning, HF Trainer and a
plain accelerate loop each train 2 CPU ranks (torchrun / accelerate launch, gloo) on real-photo
shards and stop mid-epoch with a checkpoint; the checkpoint is resumed on 1 rank and on 3, and the
run goes on for two more epochs (3 in all).

The rest of the resumed epoch is read exactly once; every later epoch is whole: each rank reads
exactly the batches of an uninterrupted loader at the new world size in that epoch (every sample
once, the remainder smaller than one global batch the only thing not read), every rank takes the
same number of steps, and the run ends after the epochs it was asked for. Lightning read ``len()``
once and HF Trainer sized every epoch by the resumed one's length, so after a resume onto fewer
ranks every later epoch was cut short, silently (issue 50)."""

from __future__ import annotations

import shutil

import pytest
from integration_support import epoch_log, key_log, launch, make_loader, photo_dataset

STOP = 2  # steps on 2 ranks before the stop: 2 x 2 x 4 = 16 of the 40 samples
EPOCHS = 3  # the run's epochs in all: the resumed one and two more
FRAMEWORKS = ("lightning", "hf", "accelerate")


def reference(shards: str, index: str, world: int, epoch: int) -> list[list[list[str]]]:
    """Per rank, the keys of every batch of an uninterrupted ``epoch`` at ``world`` ranks."""
    out = []
    for rank in range(world):
        loader = make_loader(shards, index, rank=rank, world=world)
        loader.set_epoch(epoch)
        out.append([list(b.keys) for b in loader])
    return out


def run(framework: str, root, name: str, *, nproc: int, resume=None):
    """One run of ``framework``'s worker: with ``resume`` None, 2 ranks stopped after ``STOP``
    steps with a checkpoint there; else that checkpoint resumed for ``EPOCHS`` epochs in all."""
    data = root["data"]
    common = ["--shards", data["shards"], "--index", data["index"], "--keys-dir", str(root["dir"] / name)]
    if framework == "lightning":
        ckpt = root["dir"] / f"{name}-ckpt"
        if resume is None:
            extra = ["--ckpt-dir", str(ckpt), "--max-steps", str(STOP), "--max-epochs", "1"]
        else:
            shutil.copytree(resume, ckpt)
            extra = ["--ckpt-dir", str(ckpt), "--ckpt", str(ckpt / "last.ckpt"), "--devices", str(nproc),
                     "--max-epochs", str(EPOCHS)]  # fmt: skip
        result = launch("lightning_worker.py", [*common, *extra], nproc=nproc)
        out = ckpt
    elif framework == "hf":
        out = root["dir"] / f"{name}-out"
        extra = ["--output-dir", str(out), "--save-steps", str(STOP)]
        if resume is None:
            extra += ["--max-steps", str(STOP)]
        else:
            extra += ["--epochs", str(EPOCHS), "--resume", str(resume)]
        result = launch("hf_worker.py", [*common, *extra], nproc=nproc)
        out = out / f"checkpoint-{STOP}"
    else:
        out = root["dir"] / f"{name}-state"
        if resume is None:
            extra = ["--state-dir", str(out), "--save-at", str(STOP), "--epochs", "1"]
        else:
            shutil.copytree(resume, out)
            extra = ["--state-dir", str(out), "--load", "--epochs", str(EPOCHS)]
        # accelerate launch's --multi_gpu needs 2 processes; one runs under torchrun, as accelerate allows.
        launcher = "accelerate" if nproc > 1 else "torchrun"
        result = launch("accelerate_worker.py", [*common, *extra], nproc=nproc, launcher=launcher)
    assert result.returncode == 0, f"{framework} {name}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    shards, index, keys = photo_dataset(tmp_path_factory.mktemp("elastic-data"))
    return {"shards": shards, "index": index, "keys": keys}


@pytest.fixture(scope="module", params=FRAMEWORKS)
def stopped(request, dataset, tmp_path_factory):
    """A framework's 2-rank run stopped after ``STOP`` steps, its checkpoint, and its batches."""
    root = {"dir": tmp_path_factory.mktemp(f"elastic-{request.param}"), "data": dataset}
    checkpoint = run(request.param, root, "stopped", nproc=2)
    before = [key_log(root["dir"] / "stopped", r)[:STOP] for r in range(2)]
    assert before == [b[:STOP] for b in reference(dataset["shards"], dataset["index"], 2, 0)]
    return request.param, root, checkpoint, before


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 3])
def test_every_epoch_after_a_resume_onto_another_world_size_is_whole(stopped, world):
    framework, root, checkpoint, before = stopped
    data = root["data"]
    name = f"resumed-{world}"
    run(framework, root, name, nproc=world, resume=checkpoint)
    logs = [key_log(root["dir"] / name, r) for r in range(world)]
    epochs = [epoch_log(root["dir"] / name, r) for r in range(world)]
    assert [len(e) for e in epochs] == [len(b) for b in logs], "one epoch logged per batch"

    def in_epoch(rank: int, epoch: int) -> list[list[str]]:
        return [b for b, e in zip(logs[rank], epochs[rank], strict=True) if e == epoch]

    # The rest of the resumed epoch: every sample not read before the stop, once.
    read_before = [k for rank in before for b in rank for k in b]
    rest = [k for rank in range(world) for b in in_epoch(rank, 0) for k in b]
    assert len(rest) == len(set(rest)) and not set(rest) & set(read_before), "nothing read twice"
    assert sorted(read_before + rest) == sorted(data["keys"]), "the resumed epoch is whole"
    assert len({len(in_epoch(r, 0)) for r in range(world)}) == 1, "equal steps on every rank"
    # Every later epoch: exactly an uninterrupted epoch at the new world size.
    for epoch in range(1, EPOCHS):
        expected = reference(data["shards"], data["index"], world, epoch)
        whole = len(data["keys"]) // (world * 4)
        assert all(len(rank) == whole for rank in expected)
        for rank in range(world):
            got = in_epoch(rank, epoch)
            where = f"{framework}, epoch {epoch}, rank {rank}"
            assert len(got) == whole, f"{where}: {len(got)} of {whole} batches"
            assert got == expected[rank], f"{where}: not the epoch's batches"
        read = [k for rank in expected for b in rank for k in b]
        assert len(set(read)) == len(read) and len(data["keys"]) - len(read) < world * 4
    assert all(set(e) == set(range(EPOCHS)) for e in epochs), "the run trains the epochs it was asked for"
