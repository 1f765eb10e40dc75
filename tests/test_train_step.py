"""The training step never waits on the device just to log, and its input time is all counted.

* Device values (loss, grad norm, logit scale) are read every ``log.every_steps`` steps, all of the
  window's steps in one transfer: between logging steps a step reads nothing from the device
  (counted on every rank under a real torchrun), and every step's logged loss is bit-identical to
  the one a per-step read gives (``log.every_steps 1``, what the trainer did before).
* ``input_frac`` (the step time between two model steps that is not the model) includes a slow
  tokenizer and a slow loader.
* The next step's inputs are staged ahead, and a checkpoint's loader position counts only the
  batches that steps used (the exact-resume tests in test_train_resume.py cover the rest).
* fp16's dynamic loss scaling counts skipped steps in the log and keeps the scaler in checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_support import build_small_dataset, read_log, small_config_args, torchrun

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    return build_small_dataset(tmp_path_factory.mktemp("data"))


def step_records(output_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_log(output_dir) if r["type"] == "step"}


QUIET = ["--data.heldout", "", "--eval.zeroshot", "", "--checkpoint.every_steps", "0"]


@pytest.mark.slow
def test_no_device_read_between_logging_steps_and_the_same_losses(dataset, tmp_path: Path) -> None:
    # 128 samples / (8 x 2 ranks) = 8 steps; logging every 4
    deferred, every = tmp_path / "deferred", tmp_path / "every"
    args = [*QUIET, "--checkpoint.at_end", "false", "--train.epochs", "1"]
    run = torchrun(
        small_config_args(
            dataset,
            deferred,
            *args,
            "--log.every_steps",
            "4",
            "--train.callbacks",
            "[train_probes:CountDeviceReads]",
        ),
        timeout=240,
        extra_path=str(HERE),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    reference = torchrun(small_config_args(dataset, every, *args, "--log.every_steps", "1"), timeout=240)
    assert reference.returncode == 0, reference.stdout + reference.stderr

    for rank in (0, 1):
        reads = {int(k): v for k, v in json.loads((deferred / f"reads-{rank}.json").read_text()).items()}
        assert sorted(reads) == list(range(1, 9))
        quiet = {s: n for s, n in reads.items() if s % 4}
        assert all(n == 0 for n in quiet.values()), f"rank {rank}: device reads on non-logging steps {quiet}"
        assert reads[4] > 0 and reads[8] > 0  # the logging steps read the window (and reduce the loss)

    got, expected = step_records(deferred), step_records(every)
    assert sorted(got) == sorted(expected) == list(range(1, 9))
    for step, record in expected.items():
        for key in ("loss", "grad_norm", "logit_scale", "lr"):
            assert got[step][key] == record[key], f"step {step}: {key} {got[step][key]} != {record[key]}"
    # the console shows the logging steps' global losses
    assert f"step 4/8  epoch 0  loss {expected[4]['loss']:.4f}" in run.stdout
    assert f"step 8/8  epoch 0  loss {expected[8]['loss']:.4f}" in run.stdout


def _train_in_process(data, output_dir: Path, *extra: str) -> list[dict]:
    from shardstream.train import load_config, train

    args = small_config_args(data, output_dir, *QUIET, "--checkpoint.at_end", "false", *extra)
    train(load_config(None, args))
    return [r for r in read_log(output_dir) if r["type"] == "step"]


@pytest.mark.parametrize("probe", ["SlowTokenizer", "SlowLoader"])
def test_slow_tokenizer_or_loader_shows_in_input_time(
    dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe: str
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("SHARDSTREAM_TEST_DELAY_S", "0.25")
    # A slow Python tokenizer only runs when the loader does not tokenize.
    in_loader = "false" if probe == "SlowTokenizer" else "true"
    records = _train_in_process(
        dataset, tmp_path / "run", "--train.max_steps", "4", "--train.callbacks", f"[train_probes:{probe}]",
        "--data.tokenize_in_loader", in_loader,
    )  # fmt: skip
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # the last step stages nothing (the run ends), the others stage the next step's one batch
    for r in records[:-1]:
        assert r["input_s"] >= 0.25, r
        assert r["input_s"] <= r["step_time_s"]
        part = "tokenize_s" if probe == "SlowTokenizer" else "loader_wait_s"
        assert r[part] >= 0.25, r
    assert min(r["input_frac"] for r in records[:-1]) > 0.25 / (0.25 + max(r["step_time_s"] for r in records))


def test_the_trainer_has_the_loader_tokenize(
    dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default the step never tokenizes in Python: the loader's Rust threads fill batch.tokens
    (a slow Python tokenizer then costs nothing), token-identical to the model's tokenizer."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("SHARDSTREAM_TEST_DELAY_S", "0.25")
    records = _train_in_process(
        dataset,
        tmp_path / "run",
        "--train.max_steps",
        "3",
        "--train.callbacks",
        "[train_probes:SlowTokenizer]",
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["tokenize_s"] == 0.0 for r in records), records
    python_side = _train_in_process(
        dataset, tmp_path / "py", "--train.max_steps", "3", "--data.tokenize_in_loader", "false"
    )
    assert [r["loss"] for r in records] == [r["loss"] for r in python_side], (
        "the same tokens, the same losses"
    )


def test_loader_tokens_are_used_instead_of_tokenizing() -> None:
    """A batch that carries ``tokens`` (ShardLoader(tokenizer=...)) is not tokenized again."""
    from types import SimpleNamespace

    from shardstream.train.inputs import InputPipeline

    calls: list[list[str]] = []

    def tokenizer(texts: list[str]) -> torch.Tensor:
        calls.append(texts)
        return torch.ones((len(texts), 16), dtype=torch.int64)

    images = torch.zeros((2, 3, 4, 4), dtype=torch.uint8)
    with_tokens = SimpleNamespace(
        images=images, texts=["a", "b"], keys=["1", "2"], tokens=torch.zeros((2, 16), dtype=torch.int64)
    )
    without = SimpleNamespace(images=images, texts=["c", "d"], keys=["3", "4"])
    pipeline = InputPipeline(
        torch.device("cpu"), 1, normalise=lambda x: x.float(), tokenizer=tokenizer, context_length=16
    )
    pipeline.start(iter([with_tokens, without]))
    first = pipeline.take()
    assert first is not None and calls == [] and first.tokenize_s == 0.0
    assert torch.equal(first.micro[0][1], with_tokens.tokens)
    second = pipeline.take()
    assert second is not None and calls == [["c", "d"]]
    assert pipeline.take() is None

    wrong = SimpleNamespace(
        images=images, texts=["a"], keys=["1"], tokens=torch.zeros((2, 77), dtype=torch.int64)
    )
    pipeline.start(iter([wrong]))
    with pytest.raises(ValueError, match="context length 77, the model expects 16"):
        pipeline.take()


def test_staging_keeps_one_step_ahead_and_stops_at_the_iterator_end() -> None:
    from types import SimpleNamespace

    from shardstream.train.inputs import InputPipeline

    pulled: list[int] = []

    def batches():
        for i in range(5):
            pulled.append(i)
            yield SimpleNamespace(
                images=torch.zeros((1, 3, 2, 2), dtype=torch.uint8), texts=[str(i)], keys=[str(i)]
            )

    pipeline = InputPipeline(
        torch.device("cpu"),
        2,
        normalise=lambda x: x.float(),
        tokenizer=lambda t: torch.zeros((len(t), 4), dtype=torch.int64),
    )
    pipeline.start(batches())
    step1 = pipeline.take()
    assert step1 is not None and [b.keys for b in step1.batches] == [["0"], ["1"]] and pulled == [0, 1]
    pipeline.stage()
    assert pulled == [0, 1, 2, 3]  # the next step's two batches, before it is taken
    step2 = pipeline.take()
    assert step2 is not None and [b.keys for b in step2.batches] == [["2"], ["3"]]
    assert pipeline.take() is None  # one batch left: not a whole step


def test_fp16_skipped_steps_are_counted_in_the_log(
    dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 with dynamic loss scaling in the trainer (CPU autocast to float16, torch.amp's
    GradScaler on the CPU): a step whose scaled gradients overflow is skipped, counted, and the
    scale halves; the parameters do not move."""
    monkeypatch.syspath_prepend(str(HERE))
    out = tmp_path / "run"
    records = _train_in_process(
        dataset, out, "--model.precision", "fp16", "--train.max_steps", "3", "--log.every_steps", "2",
        "--train.callbacks", "[train_probes:HugeLossScale]", "--checkpoint.at_end", "true",
    )  # fmt: skip
    assert [r["skipped_steps"] for r in records] == [1, 2, 3]
    assert [r["loss_scale"] for r in records] == [2.0**39, 2.0**38, 2.0**37]
    assert all(r["loss"] > 0 for r in records)
    # the checkpoint keeps the scaler (scale and count), so a resumed run goes on from there
    from shardstream.train.checkpoint import load_checkpoint

    payload = load_checkpoint(out / "checkpoints" / "step-00000003.pt")
    assert payload["scaler"]["scale"] == 2.0**37 and payload["scaler"]["skipped_steps"] == 3
    # every step skipped: fused AdamW (found_inf handed over on the device) never took a step
    states = payload["optimizer"]["state"].values()
    assert states and all(float(st["step"]) == 0 and not st["exp_avg"].any() for st in states)
