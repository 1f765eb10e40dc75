"""``dist.strategy: fsdp``: FSDP2 on 2 ranks under torchrun (gloo, CPU, fp32, accumulation 2).

- its losses equal a DDP run's (relative difference < 2e-3 per step, 12 steps over 3 epochs);
- stopped at step 5 (a sharded ``step-00000005.dcp`` folder) and resumed, it gives the
  uninterrupted run's samples and losses; the same folder resumes on 1 rank (DCP reshards, the
  loader re-plans the rest of the epoch: nothing read twice);
- with ``checkpoint.dir: s3://...`` (SeaweedFS) every rank uploads its shards; stopped at step 5,
  a fresh output_dir with no local files resumes ``latest`` from the bucket with the losses of the
  resume from a local folder; the bucket keeps the ``keep`` newest folders;
- ``export`` of its final sharded checkpoint loads in open_clip with the trainer's features;
- a folder whose DCP metadata names anything but DCP's own types is refused, not unpickled;
- the combinations it does not support are refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from servers import SeaweedS3
from train_support import ROOT, build_small_dataset, read_log, run_bounded, small_config_args, torchrun

TESTS = str(Path(__file__).resolve().parent)
COMMON = [
    "--data.heldout", "", "--eval.zeroshot", "",
    "--train.accum_steps", "2", "--train.epochs", "3",  # 128 / (8 x 2 ranks x 2) = 4 steps per epoch
    "--log.log_keys", "true", "--checkpoint.every_steps", "0",
]  # fmt: skip
FSDP = ["--dist.strategy", "fsdp"]
LOADER = (ROOT / "tests" / "test_train_export.py").read_text(encoding="utf-8").split('LOADER = """')[1]
LOADER = LOADER.split('"""')[0]


POINTER_AT_STOP: list[str] = []  # `latest` as the stopped run left it (the resumed runs move it on)


def steps(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if r["type"] == "step"}


def ok(run: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The runs the tests share: DDP, FSDP uninterrupted, FSDP stopped at 5 then resumed on 2
    ranks, and a copy of the stopped one resumed on 1 rank."""
    root = tmp_path_factory.mktemp("fsdp")
    data = build_small_dataset(root / "data")  # 128 training samples
    out = {name: root / name for name in ("ddp", "ddp-elastic", "whole", "parts", "elastic")}
    out["data"] = root / "data"
    # checkpoints do not change the run (they read the RNG states, draw nothing): its step 5 is
    # resumed on 1 rank below, DDP's own elastic path, the reference for FSDP's
    at_5 = ["--checkpoint.every_steps", "5", "--checkpoint.keep", "0"]
    ok(torchrun(small_config_args(data, out["ddp"], *COMMON, *at_5), timeout=300))
    ddp_5 = str(out["ddp"] / "checkpoints" / "step-00000005.pt")
    ok(
        torchrun(
            small_config_args(data, out["ddp-elastic"], *COMMON, "--resume", ddp_5), nproc=1, timeout=300
        )
    )
    probe = ["--train.callbacks", "[train_probes:SaveFeatures]"]
    ok(torchrun(small_config_args(data, out["whole"], *COMMON, *FSDP, *probe), timeout=300, extra_path=TESTS))
    first = ok(
        torchrun(
            small_config_args(data, out["parts"], *COMMON, *FSDP, "--train.stop_at_step", "5"), timeout=300
        )
    )
    assert "training stopped early at step 5" in first.stdout
    POINTER_AT_STOP.append((out["parts"] / "checkpoints" / "latest").read_text())
    shutil.copytree(out["parts"], out["elastic"])
    second = ok(
        torchrun(small_config_args(data, out["parts"], *COMMON, *FSDP, "--resume", "latest"), timeout=300)
    )
    assert "at step 5 (epoch 1, step 1 in it)" in second.stdout
    one = ok(
        torchrun(
            small_config_args(data, out["elastic"], *COMMON, *FSDP, "--resume", "latest"),
            nproc=1,
            timeout=300,
        )
    )
    assert "checkpoint from 2 ranks onto 1" in one.stdout
    return out


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_fsdp_losses_equal_ddp_losses(runs: dict[str, Path]) -> None:
    ddp, fsdp = steps(read_log(runs["ddp"])), steps(read_log(runs["whole"]))
    assert sorted(ddp) == sorted(fsdp) == list(range(1, 13))
    for step, record in ddp.items():
        assert fsdp[step]["keys"] == record["keys"], f"step {step}: other samples"
        relative = abs(fsdp[step]["loss"] - record["loss"]) / abs(record["loss"])
        assert relative < 2e-3, f"step {step}: FSDP {fsdp[step]['loss']} vs DDP {record['loss']}"
    # the losses move: the comparison is between two trainings, not two initialisations
    assert abs(ddp[12]["loss"] - ddp[1]["loss"]) > 1e-3


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_fsdp_checkpoint_is_a_sharded_folder_that_resumes_exactly(runs: dict[str, Path]) -> None:
    folder = runs["elastic"] / "checkpoints" / "step-00000005.dcp"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt"], files
    (pointer,) = POINTER_AT_STOP
    assert '"name": "step-00000005.dcp", "step": 5' in pointer
    expected, got = steps(read_log(runs["whole"])), steps(read_log(runs["parts"]))
    assert sorted(got) == sorted(expected)
    for step, record in expected.items():
        assert got[step]["keys"] == record["keys"], f"step {step}: different samples after resume"
        assert got[step]["lr"] == record["lr"]
        assert got[step]["loss"] == pytest.approx(record["loss"], rel=1e-6, abs=0), f"step {step}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_fsdp_checkpoint_of_2_ranks_resumes_on_1(runs: dict[str, Path]) -> None:
    records = read_log(runs["elastic"])
    resumed = [r for r in records if r["type"] == "step" and r["step"] > 5]
    # epoch 1 had 1 step x 32 samples done: the other 96 re-planned for one rank (6 steps of 2 x 8)
    assert [r["step"] for r in resumed] == list(range(6, 20))
    assert [r["epoch"] for r in resumed] == [1] * 6 + [2] * 8
    epoch_records = [r for r in records if r["type"] == "epoch"]
    assert [(e["epoch"], e["samples"]) for e in epoch_records] == [(0, 128), (1, 96), (2, 128)]
    rest_of_epoch1 = [k for r in resumed[:6] for k in r["keys"]]
    assert len(rest_of_epoch1) == len(set(rest_of_epoch1)) == 96
    before = steps(records)[5]
    assert not set(rest_of_epoch1) & set(before["keys"])
    # the weights and optimizer state came back resharded: the losses are those of DDP's own
    # 2 -> 1 rank resume from its step 5 (the global batch halves, so do not compare with step 5)
    reference = steps(read_log(runs["ddp-elastic"]))
    assert sorted(reference) == list(range(6, 20))
    for r in resumed:
        assert r["keys"] == reference[r["step"]]["keys"]
        relative = abs(r["loss"] - reference[r["step"]]["loss"]) / abs(reference[r["step"]]["loss"])
        assert relative < 2e-3, f"step {r['step']}: FSDP {r['loss']} vs DDP {reference[r['step']]['loss']}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_fsdp_checkpoints_on_s3_resume_onto_an_empty_disk(
    runs: dict[str, Path],
    s3: SeaweedS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hermetic_aws_env: None,
) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    client = s3.client()
    client.create_bucket(Bucket="fsdp")
    data = build_small_dataset(runs["data"])  # made by the fixture: found, not rebuilt
    args = [*COMMON, *FSDP, "--checkpoint.dir", "s3://fsdp/run", "--checkpoint.keep", "2"]
    first = tmp_path / "first"
    ok(
        torchrun(
            small_config_args(
                data, first, *args, "--checkpoint.every_steps", "2", "--train.stop_at_step", "5"
            ),
            timeout=300,
        )
    )
    assert not (first / "checkpoints").exists()
    assert not [p for p in (first / ".checkpoint-staging").rglob("*") if p.is_file()]
    listed = client.list_objects_v2(Bucket="fsdp", Prefix="run/").get("Contents", [])
    stored = {o["Key"][4:]: client.get_object(Bucket="fsdp", Key=o["Key"])["Body"].read() for o in listed}
    shards = (".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt")
    # checkpoints at steps 2, 4 and the stop at 5; keep 2: step 2's folder is gone from the bucket
    assert sorted(stored) == ["latest", *(f"step-{s:08d}.dcp/{n}" for s in (4, 5) for n in shards)]
    folder = "step-00000005.dcp/"
    manifest = sorted(
        f"{k[len(folder) :]}\t{len(v)}\t{hashlib.sha256(v).hexdigest()}\n"
        for k, v in stored.items()
        if k.startswith(folder)
    )
    sha256 = hashlib.sha256("".join(manifest).encode()).hexdigest()
    assert json.loads(stored["latest"]) == {"name": "step-00000005.dcp", "step": 5, "sha256": sha256}

    fresh = tmp_path / "fresh"  # a new node: an empty disk
    run = ok(torchrun(small_config_args(data, fresh, *args, "--resume", "latest"), timeout=300))
    assert "resumed from s3://fsdp/run/step-00000005.dcp at step 5 (epoch 1, step 1 in it)" in run.stdout
    assert not list(fresh.glob(".resume-rank*"))  # every rank's download is gone once loaded
    got, local = steps(read_log(fresh)), steps(read_log(runs["parts"]))
    assert sorted(got) == list(range(6, 13))
    for step, record in got.items():  # the same bytes as the local folder's resume: the same losses
        assert record["keys"] == local[step]["keys"], f"step {step}: different samples"
        assert record["loss"] == local[step]["loss"], (
            f"step {step}: {record['loss']} != {local[step]['loss']}"
        )


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bounded([sys.executable, "-m", "shardstream.train", "export", *args], timeout=180)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_export_of_a_sharded_checkpoint_loads_in_open_clip_with_the_trainers_features(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    checkpoint = runs["whole"] / "checkpoints" / "step-00000012.dcp"
    exported = tmp_path / "model.pt"
    run = ok(export(str(checkpoint), "-o", str(exported)))
    assert f"exported step 12 of shardstream-tiny (7.8 M parameters) to {exported}" in run.stdout
    state = torch.load(exported, weights_only=True)
    assert state["logit_scale"].shape == ()  # FSDP's 1-element vector is open_clip's scalar again
    lines = run.stdout.splitlines()
    calls = "\n".join(line.strip() for line in lines[lines.index("load it with open_clip:") + 1 :])
    trained = torch.load(runs["whole"] / "features.pt", weights_only=True)
    (tmp_path / "calls.py").write_text(calls)
    torch.save({"images": trained["images"], "texts": trained["texts"]}, tmp_path / "inputs.pt")
    (tmp_path / "load.py").write_text(LOADER)
    cmd = [
        sys.executable,
        str(tmp_path / "load.py"),
        *(str(tmp_path / n) for n in ("calls.py", "inputs.pt", "f.pt")),
    ]
    loaded = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    features = torch.load(tmp_path / "f.pt", weights_only=True)
    torch.testing.assert_close(features["image"], trained["image"], atol=1e-5, rtol=0)
    torch.testing.assert_close(features["text"], trained["text"], atol=1e-5, rtol=0)


class _Runs:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("UNPICKLED",))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_dcp_metadata_naming_other_callables_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "step-00000012.dcp"
    shutil.copytree(runs["whole"] / "checkpoints" / "step-00000012.dcp", folder)
    (folder / ".metadata").write_bytes(pickle.dumps(_Runs()))
    run = export(str(folder), "-o", str(tmp_path / "model.pt"))
    assert run.returncode == 2 and "UNPICKLED" not in run.stdout + run.stderr
    assert run.stderr.splitlines() == [
        f"python -m shardstream.train export: error: {folder / '.metadata'}: refused, it names "
        "builtins.print, not a DCP metadata type"
    ]
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--train.compile", "true"], "train.compile"),
        (["--model.precision", "fp16"], "model.precision fp16 (use bf16, fp32 or pure_bf16)"),
        (["--model.lock_image", "true"], "model.lock_image"),
    ],
)
def test_unsupported_combinations_are_refused_in_one_line(args: list[str], what: str) -> None:
    from shardstream.train import load_config
    from shardstream.train.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(None, ["--data.train", "demo", "--dist.strategy", "fsdp", *args])
    assert str(info.value) == f"dist.strategy: fsdp does not support {what}; use dist.strategy ddp"


class _Schedule:
    def __init__(self) -> None:
        self.step = 7

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}


def test_sharded_checkpoint_in_one_process_round_trips_and_its_identity_covers_every_file(
    tmp_path: Path,
) -> None:
    from shardstream.train import checkpoint as ckpt
    from shardstream.train import fsdp
    from shardstream.train.dist import DistContext

    ctx = DistContext(0, 1, 0, 1, torch.device("cpu"), None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 6)).square().mean().backward()
    optimizer.step()
    state = ckpt.TrainingState(3, 0, 3, {"position": [1, 2]})
    directory = tmp_path / "checkpoints"
    path = fsdp.save_sharded(
        directory, ctx=ctx, model=model, optimizer=optimizer, scheduler=_Schedule(), state=state,
        config={"model": {"name": "x"}}, keep=2,
    )  # fmt: skip
    assert path == directory / "step-00000003.dcp" and not (directory / "step-00000003.dcp.tmp").exists()
    identity = ckpt.agree_on_checkpoint(ctx, "latest", directory)
    assert identity is not None and identity.name == path.name and identity.step == 3
    assert identity.sha256 == ckpt.folder_sha256(path)

    fresh = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    payload = fsdp.load_sharded(path, fresh, fresh_optimizer)
    assert ckpt.training_state(payload) == state and payload["scheduler"] == {"step": 7}
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in optimizer.state.values()]
    assert all(
        torch.equal(s["exp_avg"], m) for s, m in zip(fresh_optimizer.state.values(), moments, strict=True)
    )

    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one bit of one shard: another checkpoint
    shard.write_bytes(bytes(data))
    with pytest.raises(ckpt.ResumeError, match=r"rank 0: different content"):
        ckpt.agree_on_checkpoint(ctx, "latest", directory)
