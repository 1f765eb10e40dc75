"""The trainer's device-dependent choices, as pure functions of (device type, config) where the
GPU itself is needed to see them: intra-op threads on every device type, and fused optimizers on
CUDA and CPU so that fp16's GradScaler never makes the host read found_inf. The fused SGD is run
for real on CPU under a GradScaler."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from shardstream.train.config import OptimConfig
from shardstream.train.device_setup import build_optimizer, intra_op_threads, optimizer_options
from train_support import build_small_dataset, read_log, small_config_args

HERE = Path(__file__).resolve().parent
SGD = dataclasses.replace(OptimConfig(), optimizer="sgd", momentum=0.8)
ADAMW = dataclasses.replace(OptimConfig(), optimizer="adamw", betas=[0.9, 0.95], eps=1e-8)


@pytest.mark.parametrize(
    ("torch_threads", "local_processes", "cores", "expected"),
    [
        (0, 8, 64, 8),  # 8 GPUs on a 64-core node: the config's "cores / local processes"
        (0, 3, 16, 5),
        (0, 1, 2, 2),
        (0, 32, 16, 1),  # more processes than cores: still one thread each
        (0, 4, None, 1),  # os.cpu_count() may not know
        (6, 8, 64, 6),  # an explicit count wins
    ],
)
def test_thread_count(torch_threads: int, local_processes: int, cores: int | None, expected: int) -> None:
    assert intra_op_threads(torch_threads, local_processes, cores) == expected


@pytest.mark.parametrize(("device_type", "fused"), [("cuda", True), ("cpu", True), ("mps", False)])
def test_sgd_options(device_type: str, fused: bool) -> None:
    assert optimizer_options(SGD, device_type, lr=0.5) == {
        "lr": 0.5,
        "momentum": 0.8,
        "nesterov": True,
        "fused": fused,
    }


@pytest.mark.parametrize(("device_type", "fused"), [("cuda", True), ("cpu", True), ("mps", False)])
def test_adamw_options(device_type: str, fused: bool) -> None:
    assert optimizer_options(ADAMW, device_type, lr=0.5) == {
        "lr": 0.5,
        "betas": (0.9, 0.95),
        "eps": 1e-8,
        "fused": fused,
    }


def two_groups(seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(5, 3, generator=generator))
    bias = torch.nn.Parameter(torch.randn(5, generator=generator))
    return [{"params": [weight], "weight_decay": 0.1}, {"params": [bias], "weight_decay": 0.0}]


def scaled_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, poison: bool) -> None:
    optimizer.zero_grad(set_to_none=True)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    loss = sum((p**2).sum() for p in params)
    if poison:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def test_fused_sgd_under_grad_scaler_matches_unfused_and_skips_overflow() -> None:
    fused = build_optimizer(two_groups(0), SGD, "cpu", lr=0.05)
    plain = torch.optim.SGD(two_groups(0), lr=0.05, momentum=0.8, nesterov=True)
    assert fused.defaults["fused"] is True
    # GradScaler hands found_inf to such an optimizer instead of reading it on the host
    assert getattr(fused, "_step_supports_amp_scaling", False)
    # fp16's first steps routinely overflow; an overflowing step must change nothing, the first
    # one included (fused SGD left its momentum buffers uninitialised there)
    for poison in (True, False, True, False, False):
        for optimizer in (fused, plain):
            scaled_step(optimizer, torch.amp.GradScaler("cpu", init_scale=256.0), poison)
    for got, want in zip(fused.param_groups, plain.param_groups, strict=True):
        torch.testing.assert_close(got["params"][0], want["params"][0], rtol=1e-6, atol=1e-6)
    untouched = two_groups(0)[0]["params"][0]
    assert not torch.equal(fused.param_groups[0]["params"][0], untouched)


def test_build_optimizer_makes_the_configured_class() -> None:
    assert type(build_optimizer(two_groups(1), ADAMW, "cpu", lr=1e-3)) is torch.optim.AdamW
    assert type(build_optimizer(two_groups(1), SGD, "cpu", lr=1e-3)) is torch.optim.SGD


QUIET = ["--data.heldout", "", "--eval.zeroshot", "", "--checkpoint.every_steps", "0"]


def test_trainer_fp16_sgd_is_fused_and_skips_overflowing_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's fp16 path with SGD (CPU autocast to float16, GradScaler on the CPU, a loss
    scale so large that the first steps overflow): the fused SGD takes found_inf from the scaler,
    so the skipped steps leave no momentum behind, and the step after them trains."""
    from shardstream.train import load_config, train
    from shardstream.train.checkpoint import load_checkpoint

    monkeypatch.syspath_prepend(str(HERE))
    data = build_small_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = small_config_args(
        data, out, *QUIET, "--optim.optimizer", "sgd", "--model.precision", "fp16",
        "--train.max_steps", "2", "--log.every_steps", "1", "--checkpoint.at_end", "true",
        "--train.callbacks", "[train_probes:HugeLossScale]",
    )  # fmt: skip
    train(load_config(None, args))
    records = [r for r in read_log(out) if r["type"] == "step"]
    assert [r["skipped_steps"] for r in records] == [1, 2]
    payload = load_checkpoint(out / "checkpoints" / "step-00000002.pt")
    groups = payload["optimizer"]["param_groups"]
    assert groups and all(g["fused"] is True and g["nesterov"] is True for g in groups)
    # no step was taken: the momentum is still zero, not memory the skipped kernel never wrote
    buffers = [st["momentum_buffer"] for st in payload["optimizer"]["state"].values()]
    assert buffers and not any(buffer.any() for buffer in buffers)
