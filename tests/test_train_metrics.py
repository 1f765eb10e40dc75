"""The logged metrics tell the truth about every rank, and the plot command draws them.

* One real 2-rank torchrun where rank 1's loader sleeps before each batch: every logging window's
  record on rank 0 shows rank 1's loader wait as the max over ranks (named as rank 1's), rank 0's
  own wait stays small, and the mean is the two ranks' mean (rank 0's half read back from its own
  per-step records). The window's wall-clock throughput covers more than the steps' own time.
  TensorBoard and the console show the same figures; TensorBoard writes every key wandb logs.
* In one process, the window's figures are the process's own, and its wall clock includes what
  happens between steps (a checkpoint's time after a flush counts in the next window).
* ``device_idle_s`` (max and mean over ranks) is in a window's record on CUDA only: on the CPU
  the key is absent; on a GPU it counts the host's pauses between steps' compute as idle.
* ``python -m shardstream.train plot`` turns that run's log.jsonl into a PNG, and a missing log
  into one line naming it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from train_support import ROOT, build_small_dataset, read_log, run_bounded, small_config_args, torchrun

SLEEP_S = 0.3
EVERY = 3

# rank 1 only: its loader sleeps before handing over each batch
SLOW_RANK_MODULE = f"""
import time
from shardstream.train import Callback


class _Slow:
    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            time.sleep({SLEEP_S})
            yield batch

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # set_epoch, state_dict, stats, ...
        return getattr(self.loader, name)


class SlowRankOne(Callback):
    def on_train_start(self, trainer):
        if trainer.ctx.rank == 1:
            trainer.loader = _Slow(trainer.loader)
"""


class SlowRun:
    def __init__(self, output_dir: Path, stdout: str) -> None:
        self.output_dir = output_dir
        self.stdout = stdout
        self.steps = [r for r in read_log(output_dir) if r["type"] == "step"]


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory) -> SlowRun:
    root = tmp_path_factory.mktemp("metrics")
    data = build_small_dataset(root / "data")
    (root / "cb").mkdir()
    (root / "cb" / "slow_rank_cb.py").write_text(SLOW_RANK_MODULE)
    out = root / "run"
    args = small_config_args(
        data, out,
        "--data.heldout", "", "--eval.zeroshot", "", "--checkpoint.every_steps", "0",
        "--checkpoint.at_end", "false", "--train.max_steps", "6", "--log.every_steps", str(EVERY),
        "--log.tensorboard", "true", "--train.callbacks", "[slow_rank_cb:SlowRankOne]",
    )  # fmt: skip
    run = torchrun(args, timeout=240, extra_path=str(root / "cb"))
    assert run.returncode == 0, run.stdout + run.stderr
    return SlowRun(out, run.stdout)


def test_the_slow_rank_shows_in_the_max_loader_wait_logged_on_rank_0(slow_run: SlowRun) -> None:
    steps = slow_run.steps
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    windows = [steps[:EVERY], steps[EVERY:]]
    for window in windows:
        last = window[-1]
        assert all("loader_wait_s_max" not in r for r in window[:-1])  # one set of figures per window
        # the loader batches fetched in the window: step 1 takes its own and stages the next one,
        # every later step stages the next step's, the run's last step none
        fetched = sum((2 if r["step"] == 1 else 1) - (1 if r["step"] == 6 else 0) for r in window)
        assert last["loader_wait_s_max"] >= SLEEP_S * fetched, last
        assert last["loader_wait_s_max_rank"] == 1
        rank0_wait = sum(r["loader_wait_s"] for r in window)  # log.jsonl's own records are rank 0's
        # (rank 0's first step waits for its loader to start, as rank 1's does)
        assert sum(r["loader_wait_s"] for r in window if r["step"] > 1) < SLEEP_S / 2, window
        assert last["loader_wait_s_mean"] == pytest.approx((rank0_wait + last["loader_wait_s_max"]) / 2)
        # rank 1 spends most of its steps waiting on its loader; rank 0 waits for rank 1 in the
        # gradient all-reduce, which is model time
        rank0_input = sum(r["input_s"] for r in window) / sum(r["step_time_s"] for r in window)
        assert last["input_frac_max_rank"] == 1
        assert last["input_frac_max"] > rank0_input
        assert last["input_frac_mean"] == pytest.approx((rank0_input + last["input_frac_max"]) / 2)
        # the wall clock covers the steps and everything between them (the stop vote, logging)
        assert last["window_wall_s"] >= sum(r["step_time_s"] for r in window)
        global_batch = 16  # 8 per device x 2 ranks
        assert last["samples_per_s_wall"] == pytest.approx(len(window) * global_batch / last["window_wall_s"])
        assert last["samples_per_s_per_device"] == pytest.approx(last["samples_per_s_wall"] / 2)


def test_tensorboard_and_the_console_show_the_ranks_figures(slow_run: SlowRun) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(slow_run.output_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for key in ("loader_wait_s_max", "input_frac_max", "input_frac_mean", "samples_per_s_wall"):
        assert f"train/{key}" in tags
    assert [e.step for e in events.Scalars("train/loader_wait_s_max")] == [3, 6]
    assert [e.value for e in events.Scalars("train/loader_wait_s_max")] == pytest.approx(
        [r["loader_wait_s_max"] for r in slow_run.steps if "loader_wait_s_max" in r]
    )
    last = slow_run.steps[-1]
    assert f"(ranks: max {100 * last['input_frac_max']:.0f}% on 1, mean " in slow_run.stdout


def test_tensorboard_writes_every_key_wandb_logs_a_siglip_logit_bias_too(tmp_path: Path) -> None:
    """TensorBoard once kept its own key list, without ``logit_bias``: a SigLIP run's bias was in
    log.jsonl and wandb but never in TensorBoard. Both now read ``metrics.LOGGED_KEYS``."""
    from types import SimpleNamespace

    from shardstream.train.callbacks import TensorBoardLogger
    from shardstream.train.metrics import LOGGED_KEYS
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = {"step": 7, **{key: float(i) + 0.5 for i, key in enumerate(LOGGED_KEYS)}}
    logger = TensorBoardLogger(tmp_path)
    trainer = SimpleNamespace(is_main=True, step=7)
    logger.on_train_start(trainer)  # type: ignore[arg-type]
    logger.on_log(trainer, [record])  # type: ignore[arg-type]
    logger.on_train_end(trainer)  # type: ignore[arg-type]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert "logit_bias" in LOGGED_KEYS
    for key in LOGGED_KEYS:
        (written,) = events.Scalars(f"train/{key}")
        assert (written.step, written.value) == (7, pytest.approx(record[key])), key


def test_one_process_window_is_its_own_and_counts_the_time_between_steps() -> None:
    from shardstream.train.dist import DistContext
    from shardstream.train.metrics import StepMetrics

    ctx = DistContext(
        rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend=None
    )
    metrics = StepMetrics(ctx)

    def step(number: int, wait_s: float) -> None:
        started = time.perf_counter()
        time.sleep(wait_s)  # the loader wait, as the step would measure it
        elapsed = time.perf_counter() - started
        record = {"step": number, "step_time_s": elapsed, "input_s": elapsed, "loader_wait_s": wait_s}
        metrics.add(record, torch.tensor(2.0 + number))

    step(1, 0.05)
    step(2, 0.02)
    (first, second) = metrics.flush(samples_per_step=8)
    assert "loader_wait_s_max" not in first and first["loss"] == 3.0
    assert second["loader_wait_s_max"] == second["loader_wait_s_mean"] == pytest.approx(0.07)
    assert second["loader_wait_s_max_rank"] == 0
    assert second["input_frac_max"] == second["input_frac_mean"] == pytest.approx(1.0)
    assert second["window_wall_s"] >= first["step_time_s"] + second["step_time_s"]
    assert second["samples_per_s_wall"] == second["samples_per_s_per_device"]
    assert metrics.flush(samples_per_step=8) == []  # nothing new: the window goes on

    time.sleep(0.3)  # between the steps: a checkpoint, an evaluation
    step(3, 0.01)
    (third,) = metrics.flush(samples_per_step=8)
    assert third["window_wall_s"] >= 0.3 + third["step_time_s"]
    assert third["samples_per_s_wall"] == pytest.approx(8 / third["window_wall_s"])
    assert third["samples_per_s_wall"] < 8 / 0.3
    # no CUDA events on the CPU: no device idle time either, not a 0 that looks measured
    assert not [k for r in (first, second, third) for k in r if k.startswith("device_idle")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device idle time is measured on CUDA only")
@pytest.mark.timeout(120)
def test_cuda_device_idle_time_counts_the_pauses_between_compute() -> None:
    from shardstream.train.dist import DistContext
    from shardstream.train.metrics import StepMetrics

    device = torch.device("cuda", torch.cuda.current_device())
    ctx = DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=device, backend=None)
    metrics = StepMetrics(ctx)
    a = torch.randn(2048, 2048, device=device)
    pause_s, steps = 0.05, 4
    for number in range(1, steps + 1):
        started = time.perf_counter()
        metrics.begin_compute()
        out = a
        for _ in range(20):
            out = (out @ a).tanh()
        metrics.end_compute()
        torch.cuda.synchronize()  # the device is done: the pause below is idle for it
        elapsed = time.perf_counter() - started
        metrics.add(
            {"step": number, "step_time_s": elapsed, "input_s": 0.0, "loader_wait_s": 0.0}, out.mean()
        )
        time.sleep(pause_s)  # host work between steps: no kernel queued
    records = metrics.flush(samples_per_step=8)
    last = records[-1]
    idle = last["device_idle_s_max"]
    assert last["device_idle_s_mean"] == idle and last["device_idle_s_max_rank"] == 0
    assert steps * pause_s <= idle < last["window_wall_s"]  # every pause, and not the compute
    # the rest is the compute the events measured: inside the host's brackets around it
    compute_s = last["window_wall_s"] - idle
    assert 0 < compute_s <= sum(r["step_time_s"] for r in records)
    assert "device_idle_s_max" not in records[0]  # once per window, on its last record


def test_plot_draws_the_runs_curves_as_a_png(slow_run: SlowRun, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    image = tmp_path / "curves.png"
    cmd = [sys.executable, "-m", "shardstream.train", "plot", str(slow_run.output_dir), "-o", str(image)]
    run = run_bounded(cmd, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"plotted 6 steps from {slow_run.output_dir / 'log.jsonl'} to {image}" in run.stdout
    content = image.read_bytes()
    assert content[:8] == b"\x89PNG\r\n\x1a\n" and len(content) > 10_000


def test_plot_without_a_log_says_so_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "shardstream.train", "plot", str(tmp_path), "-o", str(tmp_path / "c.png")]
    run = run_bounded(cmd, timeout=60, cwd=ROOT)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"python -m shardstream.train plot: error: {tmp_path / 'log.jsonl'}: no such log "
        "(a run's output_dir holds log.jsonl)"
    ]
    assert not (tmp_path / "c.png").exists()
