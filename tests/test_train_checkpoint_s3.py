"""Checkpoints on S3 (a real SeaweedFS server, which checks request signatures), written in the
background while training goes on:

- a 2-rank run with ``checkpoint.dir: s3://...`` stopped at step n resumes ``latest`` from the
  bucket into a fresh output_dir with no local files, and its losses from n+1 equal those of the
  uninterrupted run; the bucket holds the ``keep`` newest checkpoints and the pointer naming the
  newest with its sha256. ``SHARDSTREAM_DRILLS_LONG=1`` repeats it 5 times (stopping at other steps);
- a write that fails (the S3 server gone mid-run) is an error naming the checkpoint, at the next
  checkpoint or at the end of the run, never silence;
- missing credentials or a wrong bucket stop the run at start with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from servers import SeaweedS3
from train_support import (
    ROOT,
    SmallDataset,
    build_small_dataset,
    read_log,
    run_bounded,
    small_config_args,
    torchrun,
)

LONG = os.environ.get("SHARDSTREAM_DRILLS_LONG", "") not in ("", "0")
MAX_STEPS = 8
COMMON = [
    "--data.heldout", "", "--eval.zeroshot", "", "--train.max_steps", str(MAX_STEPS),
    "--checkpoint.every_steps", "2", "--checkpoint.keep", "2", "--log.every_steps", "2",
]  # fmt: skip
STOPS = [5, 3, 6, 2, 7] if LONG else [5]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _no_machine_aws(hermetic_aws_env: None) -> None:
    """Every test of this module runs without the machine's AWS settings (conftest.py)."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SmallDataset:
    return build_small_dataset(tmp_path_factory.mktemp("data"))


def use_s3(monkeypatch: pytest.MonkeyPatch, s3: SeaweedS3, bucket: str | None = None) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    if bucket is not None:
        client = s3.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass


def step_losses(output_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_log(output_dir) if r["type"] == "step"}


def objects(s3: SeaweedS3, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed
    }


@pytest.mark.slow
@pytest.mark.timeout(2400 if LONG else 900)
def test_resume_from_s3_onto_an_empty_disk_continues_exactly(
    dataset: SmallDataset, s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_s3(monkeypatch, s3, "ckpt-resume")
    whole = tmp_path / "whole"  # local checkpoints: where they go does not change the training
    run = torchrun(small_config_args(dataset, whole, *COMMON), timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    expected = step_losses(whole)
    assert sorted(expected) == list(range(1, MAX_STEPS + 1))

    results = []
    for i, stop in enumerate(STOPS):
        url = f"s3://ckpt-resume/drill-{i}"
        first = tmp_path / f"first-{i}"
        args = [*COMMON, "--checkpoint.dir", url]
        run = torchrun(
            small_config_args(dataset, first, *args, "--train.stop_at_step", str(stop)), timeout=300
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert not (first / "checkpoints").exists()  # nothing local but the staging folder
        assert not any(p.is_file() for p in (first / ".checkpoint-staging").glob("*"))

        # keep 2: the two newest of the checkpoints at steps 2, 4, ... and at the stop; the pointer
        # names the newest with the sha256 of its bytes, as they are in the bucket
        stored = objects(s3, "ckpt-resume", f"drill-{i}/")
        kept = sorted({*range(2, stop + 1, 2), stop})[-2:]
        assert sorted(stored) == ["latest", *(f"step-{s:08d}.pt" for s in kept)]
        pointer = json.loads(stored["latest"])
        newest = f"step-{stop:08d}.pt"
        assert pointer == {"name": newest, "step": stop, "sha256": hashlib.sha256(stored[newest]).hexdigest()}

        fresh = tmp_path / f"fresh-{i}"  # a new node: an empty disk
        run = torchrun(small_config_args(dataset, fresh, *args, "--resume", "latest"), timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"resumed from {url}/{newest} at step {stop}" in run.stdout
        assert not list(fresh.glob(".resume-rank*"))  # the downloads are gone once loaded
        got = step_losses(fresh)
        assert sorted(got) == list(range(stop + 1, MAX_STEPS + 1))
        for step, loss in got.items():
            assert loss == expected[step], f"repetition {i}, step {step}: {loss} != {expected[step]}"
        results.append(stop)
    print(f"S3 resume drill: {len(results)}/{len(STOPS)} exact (stops {results})")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("case", "extra", "stop_at", "failed", "reached"),
    [
        # gone after step 3: step 4's background write fails; the step-6 checkpoint raises it
        ("next checkpoint", ["--train.max_steps", "8", "--checkpoint.every_steps", "2"], 3, 4, 6),
        # gone after step 2: the final checkpoint's write fails; the end of the run raises it
        ("at exit", ["--train.max_steps", "3", "--checkpoint.every_steps", "0"], 2, 3, 3),
    ],
)
def test_a_failed_write_is_an_error_naming_the_checkpoint(
    dataset: SmallDataset,
    s3: SeaweedS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    extra: list[str],
    stop_at: int,
    failed: int,
    reached: int,
) -> None:
    bucket = "ckpt-fail-" + case.replace(" ", "-")
    use_s3(monkeypatch, s3, bucket)
    assert s3.proc is not None
    monkeypatch.setenv("SHARDSTREAM_TEST_STOP_SERVER", f"{s3.proc.pid}:{stop_at}")
    out = tmp_path / "run"
    args = small_config_args(
        dataset, out, *COMMON, *extra, "--checkpoint.dir", f"s3://{bucket}/run",
        "--train.callbacks", "[train_faults:StopServerAt]",
    )  # fmt: skip
    try:
        run = torchrun(args, nproc=1, timeout=300, extra_path=str(TESTS))
    finally:  # the outage ends: the same data on the same ports, for the other tests
        s3.stop()
        s3.start()
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("train_clip.py: error:")]
    name = f"s3://{bucket}/run/step-{failed:08d}.pt"
    assert len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"train_clip.py: error: checkpoint {name}: write failed: "), errors[0]
    assert "cannot reach the S3 endpoint" in errors[0], errors[0]
    assert max(r["step"] for r in read_log(out) if r["type"] == "step") == reached
    assert not [r for r in read_log(out) if r["type"] == "checkpoint" and r["step"] > reached]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["no credentials", "no such bucket"])
def test_unusable_checkpoint_storage_stops_at_start_with_one_line(
    dataset: SmallDataset, s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    use_s3(monkeypatch, s3, "ckpt-start")
    url = "s3://ckpt-start/run"
    if fault == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        expected = "access denied: no usable AWS credentials"
    else:
        url = "s3://ckpt-no-such-bucket/run"
        expected = "not found: no such bucket"
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "train_clip.py"),
        *small_config_args(dataset, out, *COMMON, "--checkpoint.dir", url),
    ]
    run = run_bounded(cmd, timeout=240)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"train_clip.py: config error: checkpoint.dir: cannot use {url}/: "), lines[0]
    assert expected in lines[0], lines[0]
    assert s3.secret_key not in run.stderr + run.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_both_stores_publish_list_fetch_and_delete_files_and_folders(
    s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from shardstream.train.storage import open_store

    if kind == "s3":
        use_s3(monkeypatch, s3, "ckpt-store")
        store = open_store("s3://ckpt-store/run-a", tmp_path / "out")
    else:
        store = open_store(str(tmp_path / "ckpts"), tmp_path / "out")
    store.check()
    assert store.names() == [] and store.get_bytes("latest") is None
    with store.writer("step-00000001.pt") as f:
        f.write(b"weights " * 1000)
    store.put_bytes("latest", b'{"name": "step-00000001.pt"}\n')
    # a failed write publishes nothing
    with pytest.raises(RuntimeError), store.writer("step-00000002.pt") as f:
        f.write(b"half")
        raise RuntimeError("serialising failed")
    # a sharded checkpoint: every rank uploads its own files into one folder
    for rank in range(2):
        shards = tmp_path / f"rank{rank}" / "step-00000003.dcp"
        (shards / "sub").mkdir(parents=True)
        (shards / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 100)
        (shards / "sub" / f"meta{rank}").write_bytes(b"m")
        store.upload_dir(shards, "step-00000003.dcp")
    assert store.names() == ["latest", "step-00000001.pt", "step-00000003.dcp"]
    assert store.exists("step-00000001.pt") and not store.exists("step-00000002.pt")
    assert store.get_bytes("step-00000001.pt") == b"weights " * 1000
    store.get_file("step-00000001.pt", tmp_path / "copy.pt")
    assert (tmp_path / "copy.pt").read_bytes() == b"weights " * 1000
    store.download_dir("step-00000003.dcp", tmp_path / "back")
    got = sorted(
        p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*") if p.is_file()
    )
    assert got == ["__0_0.distcp", "__1_0.distcp", "sub/meta0", "sub/meta1"]
    assert (tmp_path / "back" / "__1_0.distcp").read_bytes() == b"\x01" * 100
    store.delete("step-00000003.dcp")
    store.delete("step-00000001.pt")
    assert store.names() == ["latest"]
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing left staged


class _Schedule:
    def __init__(self, step: int) -> None:
        self.step = step

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}


@pytest.mark.timeout(180)
def test_a_sharded_checkpoint_goes_to_s3_and_resumes_from_an_empty_disk(
    s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process, no group (the 2-rank run is in test_train_fsdp.py): the folder's objects,
    its pointer's manifest hash as computed from the bucket's bytes, pruning of an older folder,
    the download verified and loaded, and a failed upload that leaves ``latest`` as it was."""
    import torch
    from shardstream.train import checkpoint as ckpt
    from shardstream.train import fsdp
    from shardstream.train.checkpoint_async import CheckpointWriteError
    from shardstream.train.dist import DistContext
    from shardstream.train.storage import open_store

    use_s3(monkeypatch, s3, "ckpt-dcp")
    ctx = DistContext(0, 1, 0, 1, torch.device("cpu"), None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    store = open_store("s3://ckpt-dcp/run", tmp_path / "out")
    for step in (3, 4):
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
        state = ckpt.TrainingState(step, 0, step, {"position": [step]})
        written = fsdp.save_sharded(
            store, ctx=ctx, model=model, optimizer=optimizer, scheduler=_Schedule(step), state=state,
            config={}, keep=1,
        )  # fmt: skip
        assert written == f"s3://ckpt-dcp/run/step-{step:08d}.dcp"
    stored = objects(s3, "ckpt-dcp", "run/")
    folder = "step-00000004.dcp/"
    assert sorted(stored) == ["latest", *(folder + n for n in (".metadata", "__0_0.distcp", "trainer.pt"))]
    manifest = "".join(
        sorted(
            f"{k[len(folder) :]}\t{len(v)}\t{hashlib.sha256(v).hexdigest()}\n"
            for k, v in stored.items()
            if k.startswith(folder)
        )
    )
    pointer = json.loads(stored["latest"])
    assert pointer == {
        "name": "step-00000004.dcp",
        "step": 4,
        "sha256": hashlib.sha256(manifest.encode()).hexdigest(),
    }
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing left staged

    fresh = tmp_path / "fresh"  # another node: nothing local
    identity = ckpt.agree_on_checkpoint(ctx, "latest", open_store("s3://ckpt-dcp/run", fresh), scratch=fresh)
    assert identity is not None and identity.local is not None and identity.step == 4
    other = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-2)
    payload = fsdp.load_sharded(identity.local, other, other_optimizer)
    ckpt.discard_download(Path(identity.local))
    assert ckpt.training_state(payload) == state and payload["scheduler"] == {"step": 4}
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert not list(fresh.iterdir())

    # the server refuses the next upload (a wrong key): an error naming the folder, pointer kept
    client = s3.client()
    for key in stored:
        client.delete_object(Bucket="ckpt-dcp", Key=f"run/{key}")
    client.put_object(Bucket="ckpt-dcp", Key="run/latest", Body=stored["latest"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_store("s3://ckpt-dcp/run", tmp_path / "out")
    with pytest.raises(CheckpointWriteError) as info:
        fsdp.save_sharded(
            store, ctx=ctx, model=model, optimizer=optimizer, scheduler=_Schedule(5),
            state=ckpt.TrainingState(5, 0, 5, None), config={}, keep=1,
        )  # fmt: skip
    assert str(info.value).startswith(
        "checkpoint s3://ckpt-dcp/run/step-00000005.dcp: write failed on rank 0: SourceError: "
    ), info.value
    assert "not-the-secret" not in str(info.value)
    assert objects(s3, "ckpt-dcp", "run/") == {"latest": stored["latest"]}
