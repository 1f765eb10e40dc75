"""``python -m shardstream.train plot RUN_DIR -o curves.png``: a run's training curves from its
``log.jsonl``: the loss, the learning rate, and the input fraction (the share of step time that was
not the model) per logging window, its max and mean over ranks, against the step.

matplotlib is optional (``pip install matplotlib``): without it the command says so in one line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstream._stderr import say

PROG = "python -m shardstream.train plot"


class PlotError(ValueError):
    """The run's log cannot be plotted (missing, not JSON lines, no step records)."""


@dataclass(frozen=True)
class Curves:
    steps: list[int]
    loss: list[float]
    lr: list[float]
    window_steps: list[int]  # the logging steps: the last step of each window
    input_frac_max: list[float]
    input_frac_mean: list[float]


def read_curves(log_path: Path) -> Curves:
    """The step records of ``log_path`` (a resumed run's repeated steps: the last record wins)."""
    if not log_path.is_file():
        raise PlotError(f"{log_path}: no such log (a run's output_dir holds log.jsonl)")
    steps: dict[int, dict[str, Any]] = {}
    with open(log_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise PlotError(f"{log_path}:{number}: not a JSON line ({e})") from None
            if record.get("type") == "step":
                steps[int(record["step"])] = record
    if not steps:
        raise PlotError(f"{log_path}: no step records")
    ordered = [steps[s] for s in sorted(steps)]
    windows = [r for r in ordered if "input_frac_max" in r]
    return Curves(
        steps=[r["step"] for r in ordered],
        loss=[r["loss"] for r in ordered],
        lr=[r["lr"] for r in ordered],
        window_steps=[r["step"] for r in windows],
        input_frac_max=[r["input_frac_max"] for r in windows],
        input_frac_mean=[r["input_frac_mean"] for r in windows],
    )


def plot_curves(curves: Curves, output: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    fig, (loss_ax, lr_ax, input_ax) = plt.subplots(3, 1, sharex=True, figsize=(7, 7.5))
    loss_ax.plot(curves.steps, curves.loss, color="tab:blue")
    loss_ax.set_ylabel("loss")
    loss_ax.set_title(title)
    lr_ax.plot(curves.steps, curves.lr, color="tab:green")
    lr_ax.set_ylabel("lr")
    input_ax.plot(curves.window_steps, curves.input_frac_max, marker=".", label="max over ranks")
    input_ax.plot(curves.window_steps, curves.input_frac_mean, marker=".", label="mean over ranks")
    input_ax.set_ylabel("input_frac")
    input_ax.set_ylim(0, 1)
    input_ax.set_xlabel("step")
    input_ax.legend(loc="upper right")
    for ax in (loss_ax, lr_ax, input_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Draw a run's loss, lr and input_frac (max and mean over ranks) from its log.jsonl.",
    )
    parser.add_argument(
        "run_dir", type=Path, help="the run's output_dir (holding log.jsonl), or the log itself"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the image to write, e.g. curves.png"
    )
    args = parser.parse_args(argv)
    log_path = args.run_dir if args.run_dir.suffix == ".jsonl" else args.run_dir / "log.jsonl"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        say(f"{PROG}: error: plotting needs matplotlib: pip install matplotlib")
        return 2
    try:
        curves = read_curves(log_path)
        plot_curves(curves, args.output, title=str(args.run_dir))
    except (PlotError, OSError) as e:
        say(f"{PROG}: error: {e}")
        return 2
    print(f"plotted {len(curves.steps)} steps from {log_path} to {args.output}")
    return 0


__all__ = ["Curves", "PlotError", "main", "plot_curves", "read_curves"]
