"""A missing optional package fails the run clearly: one line on every rank naming the extra to
install (shardstream[train]) or the setting that does without it, before any process group, model
or data exists. The package is hidden from the subprocesses by a sitecustomize shim (an import
hook that raises ModuleNotFoundError), not uninstalled."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from shardstream.train.config import load_config
from train_support import torchrun

HIDE = '''
import sys

class _Hidden:
    """Imports of {names} fail as if the package were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
'''


def hiding(folder: Path, *names: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(HIDE.format(names=set(names)))
    return str(folder)


class _Hidden:
    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_problems_name_the_extra_and_the_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardstream.train.deps import MissingDependency, check, problems

    monkeypatch.setattr(sys, "meta_path", [_Hidden("tensorboard"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "tensorboard", raising=False)
    (line,) = problems(load_config(None))  # the default config logs to TensorBoard
    assert line == (
        "log.tensorboard needs the tensorboard package, which is not installed: "
        "pip install 'shardstream[train]' (or tensorboard), or turn it off: --log.tensorboard false"
    )
    with pytest.raises(MissingDependency, match="tensorboard"):
        check(load_config(None))
    assert problems(load_config(None, ["--log.tensorboard", "false"])) == []


def test_required_packages_have_no_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardstream.train.deps import problems

    monkeypatch.setattr(sys, "meta_path", [_Hidden("open_clip"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "open_clip", raising=False)
    (line,) = problems(load_config(None, ["--log.tensorboard", "false"]))
    assert line == (
        "the CLIP models and loss needs the open_clip_torch package, which is not installed: "
        "pip install 'shardstream[train]' (or open_clip_torch)"
    )


class _WriteCalls:
    """A stderr that keeps each ``write`` call apart, as an unbuffered stream's syscalls are."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_error_line_is_one_write_so_ranks_sharing_a_pipe_do_not_interleave(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # CI (PYTHONUNBUFFERED=1) once read "...--log.tensorboard falsetrain_clip.py: error: ..."
    # from two ranks: print() wrote each line and its newline in two calls.
    from shardstream.train.cli import main

    monkeypatch.setattr(sys, "meta_path", [_Hidden("tensorboard"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "tensorboard", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    stderr = _WriteCalls()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert main(["--train.output_dir", str(tmp_path / "run")]) == 2
    assert stderr.calls == [
        "train_clip.py: error: log.tensorboard needs the tensorboard package, which is not installed: "
        "pip install 'shardstream[train]' (or tensorboard), or turn it off: --log.tensorboard false\n"
    ]


@pytest.mark.slow
def test_torchrun_without_tensorboard_says_so_on_every_rank_before_starting(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    args = [
        "--data.demo_dir",
        str(demo),
        "--train.output_dir",
        str(tmp_path / "run"),
        "--train.max_steps",
        "1",
    ]
    start = time.monotonic()
    run = torchrun(args, nproc=2, timeout=120, extra_path=hiding(tmp_path / "shim", "tensorboard"))
    elapsed = time.monotonic() - start
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("train_clip.py: error:")]
    assert (
        errors
        == [
            "train_clip.py: error: log.tensorboard needs the tensorboard package, which is not installed: "
            "pip install 'shardstream[train]' (or tensorboard), or turn it off: --log.tensorboard false"
        ]
        * 2
    ), run.stderr[-4000:]  # one line from each rank
    # before anything started: no process group (no peer lost), no model, no demo data
    assert "ModuleNotFoundError" not in run.stderr and "Connection closed" not in run.stderr
    assert "shardstream CLIP training" not in run.stdout
    assert not demo.exists() and not (tmp_path / "run").exists()
    assert elapsed < 60, f"{elapsed:.0f} s"
