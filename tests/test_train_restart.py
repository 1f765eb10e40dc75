"""Process failures under real torchrun (2 ranks, gloo), as a cluster delivers them.

- A rank SIGKILLed mid-epoch while rank 0 still writes a checkpoint in the background, under
  ``--max-restarts=1`` and ``--resume latest``: the write lands, the job restarts itself, resumes
  from the checkpoint, and every later step (rank 0's sample keys, the global loss) equals an
  uninterrupted run's. Before the process group's keys were isolated per restart attempt, the
  restarted ranks read the dead attempt's addresses from torchrun's store: most restarts failed
  (connection refused) or hung until the 30-minute timeout.
- A peer that never joins: the others give up after ``dist.join_timeout_s`` with one line naming
  what they waited for (so torchrun can restart them), not after the collective timeout.
- SIGTERM to torchrun (what a scheduler sends before it kills): the workers finish the step,
  write a checkpoint and exit well within torchrun's 30 s grace; the resumed run continues exactly.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from servers import free_ports
from train_support import (
    build_small_dataset,
    read_log,
    small_config_args,
    started,
    torchrun,
    torchrun_command,
)

HERE = Path(__file__).resolve().parent
# 128 samples, 2 ranks x 8: 8 steps per epoch, 16 in all; a checkpoint every 4 steps
COMMON = [
    "--data.heldout", "", "--eval.zeroshot", "", "--train.epochs", "2",
    "--log.log_keys", "true", "--checkpoint.every_steps", "4",
]  # fmt: skip
STEPS = 16


def attempts(output_dir: Path) -> list[list[dict]]:
    """log.jsonl split into the runs that appended to it (each begins with a "start" record)."""
    runs: list[list[dict]] = []
    for record in read_log(output_dir):
        if record["type"] == "start":
            runs.append([])
        runs[-1].append(record)
    return runs


def logged_step(output_dir: Path) -> int:
    """The last step in log.jsonl so far (while the trainer may be writing its last line)."""
    try:
        lines = (output_dir / "log.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    found = [int(m.group(1)) for line in lines if (m := re.match(r'\{"type": "step", "step": (\d+),', line))]
    return max(found, default=0)


def steps(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if r["type"] == "step"}


def assert_continues_exactly(resumed: list[dict], whole: dict[int, dict], from_step: int) -> None:
    got = steps(resumed)
    assert sorted(got) == list(range(from_step + 1, STEPS + 1))
    for step, record in got.items():
        assert record["keys"] == whole[step]["keys"], f"step {step}: other samples than the uninterrupted run"
        assert record["lr"] == whole[step]["lr"]
        assert record["loss"] == whole[step]["loss"], f"step {step}: loss differs from the uninterrupted run"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    return build_small_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("whole")
    run = torchrun(small_config_args(dataset, out, *COMMON), timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    whole = steps(read_log(out))
    assert sorted(whole) == list(range(1, STEPS + 1))
    return whole


@pytest.mark.slow
def test_sigkilled_rank_restarts_and_resumes_exactly(
    dataset, uninterrupted: dict[int, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    monkeypatch.setenv("SHARDSTREAM_TEST_KILL", "1:6")  # rank 1, after step 6 (checkpoint at 4)
    # Rank 0's write of the step-4 checkpoint is still in flight when rank 1 dies: rank 0's next
    # collective fails and torchrun SIGTERMs it at once. The write must still land (before, the
    # default SIGTERM action was back by then, and on a loaded machine the checkpoint was lost).
    monkeypatch.setenv("SHARDSTREAM_TEST_SLOW_WRITE_S", "4")
    callbacks = "[train_faults:SlowCheckpointWrites, train_faults:KillOnFirstAttempt]"
    args = small_config_args(dataset, out, *COMMON, "--resume", "latest", "--train.callbacks", callbacks)
    run = torchrun(args, launcher_args=["--max-restarts=1"], timeout=150, extra_path=str(HERE))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    assert re.search(r"failed \(exitcode: -9\) local_rank: 1 ", run.stderr), run.stderr[-4000:]  # SIGKILL
    assert "at step 4 (epoch 0, step 4 in it)" in run.stdout

    first, second = attempts(out)
    # log.jsonl gets the steps at logging steps and checkpoints: the checkpoint's 4 are there, the
    # steps after it died with the workers (the resumed run logs them again from 4)
    assert max(steps(first)) == 4
    assert second[0]["start_step"] == 4
    assert_continues_exactly(second, uninterrupted, from_step=4)
    assert second[-1]["type"] == "end" and second[-1]["finished"]


@pytest.mark.slow
def test_peer_that_never_joins_fails_the_join_in_bounded_time(
    dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDSTREAM_TEST_STALL_RANK", "1")
    args = small_config_args(dataset, tmp_path / "run", *COMMON, "--dist.join_timeout_s", "5")
    start = time.monotonic()
    run = torchrun(args, script=str(HERE / "train_faults.py"), timeout=90)
    elapsed = time.monotonic() - start
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("train_clip.py: error:")]
    assert len(errors) == 1, run.stderr[-4000:]
    assert "joining the gloo process group as rank 0 of 2 (store 127.0.0.1:" in errors[0]
    assert "timed out after 5 s (dist.join_timeout_s = 5)" in errors[0]
    assert elapsed < 45, f"{elapsed:.0f} s"  # start-up, 5 s of waiting, torchrun stopping the stalled rank


@pytest.mark.slow
def test_sigterm_checkpoints_promptly_and_resume_continues_exactly(
    dataset, uninterrupted: dict[int, dict], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    (port,) = free_ports(1)
    cmd = torchrun_command(small_config_args(dataset, out, *COMMON), port=port)
    with started(cmd) as proc:
        deadline = time.monotonic() + 120
        while logged_step(out) < 5:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "training did not reach step 5"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # to torchrun, which passes it on to its workers
        signalled = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("torchrun did not stop within 60 s of SIGTERM")
        stopped_in = time.monotonic() - signalled
    assert stopped_in < 20, f"{stopped_in:.1f} s"  # one step and a checkpoint; torchrun kills at 30 s
    assert "forcefully exiting" not in stderr, stderr[-4000:]  # no worker needed torchrun's SIGKILL

    (first,) = attempts(out)
    stop = max(steps(first))
    assert 5 <= stop < STEPS
    assert f"SIGTERM received: stopping after step {stop}" in stdout
    assert f"training stopped early at step {stop}" in stdout
    assert [r["step"] for r in first if r["type"] == "checkpoint"][-1] == stop
    assert first[-1]["type"] == "end" and not first[-1]["finished"]
    assert (out / "checkpoints" / f"step-{stop:08d}.pt").is_file()

    resumed = torchrun(small_config_args(dataset, out, *COMMON, "--resume", "latest"), timeout=150)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert f"at step {stop} (epoch" in resumed.stdout
    _, second = attempts(out)
    assert_continues_exactly(second, uninterrupted, from_step=stop)
