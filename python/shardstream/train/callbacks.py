"""Callbacks: add logic to the training loop without editing it.

Subclass ``Callback`` and override any of its hooks; pass instances to ``train(cfg, callbacks=...)``
or name the class in ``train.callbacks`` ('package.module:ClassName'). Hooks run on every rank, in
order: first the built-ins (logging, evaluation, checkpointing, which use this same interface),
then yours. ``on_train_end`` runs in the same order, except that the loggers (``closes_at_end``) come
last: the final evaluation and checkpoint happen in it first, so yours sees their results.

``trainer`` gives access to the run (``trainer.step``, ``.epoch``, ``.cfg``, ``.ctx`` (rank, world
size, device), ``.model``, ``.optimizer``, ``.output_dir``, ``.is_main``) and to
``trainer.evaluate()``, ``trainer.save_checkpoint()`` and ``trainer.request_stop()``.
Hooks that write files should check ``trainer.is_main``; hooks that call ``evaluate`` or
``save_checkpoint`` must do so on every rank (they are collectives).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from shardstream.train.metrics import LOGGED_KEYS

if TYPE_CHECKING:
    from shardstream.train.loop import Trainer


class Callback:
    """Base class: every hook does nothing."""

    #: True for loggers: their on_train_end runs after everyone else's (it closes their output).
    closes_at_end: bool = False

    def on_train_start(self, trainer: Trainer) -> None:
        """After set-up (and resume), before the first step."""

    def on_step_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """After each optimizer step; ``metrics``: step, epoch, lr, samples_per_s, input_frac, ...
        (this rank's). The values that live on the device (loss, grad_norm, logit_scale,
        loss_scale, skipped_steps) are there on logging steps only (every ``log.every_steps``):
        reading them every step would make the host wait for the device. ``on_log`` gets them for
        every step. A logging step's record also has its window's figures over ranks
        (loader_wait_s_max/_mean/_max_rank, input_frac_max/_mean/_max_rank, samples_per_s_wall,
        samples_per_s_per_device, window_wall_s: ``shardstream.train.metrics``)."""

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        """On logging steps (every ``log.every_steps``, and before a checkpoint, an evaluation, an
        epoch's end and the run's end): the records of every step since the last call, in order,
        each complete with its device values, read in one transfer."""

    def on_epoch_end(self, trainer: Trainer, stats: dict[str, Any]) -> None:
        """After each complete epoch; ``stats``: the loader's counters summed over ranks (samples,
        skipped_total, replaced, padded, retries, remainder: the drop_last tail)."""

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """After each evaluation; ``metrics``: recall@k, zero-shot accuracy, samples."""

    def on_checkpoint(self, trainer: Trainer, path: str | None) -> None:
        """After a checkpoint is written (``path`` on rank 0, None on the other ranks)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step (``trainer.finished`` tells whether the schedule completed)."""


class CallbackList(Callback):
    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = list(callbacks)

    def on_train_start(self, trainer: Trainer) -> None:
        for c in self.callbacks:
            c.on_train_start(trainer)

    def on_step_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_step_end(trainer, metrics)

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        for c in self.callbacks:
            c.on_log(trainer, records)

    def on_epoch_end(self, trainer: Trainer, stats: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_epoch_end(trainer, stats)

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_eval(trainer, metrics)

    def on_checkpoint(self, trainer: Trainer, path: str | None) -> None:
        for c in self.callbacks:
            c.on_checkpoint(trainer, path)

    def on_train_end(self, trainer: Trainer) -> None:
        # Loggers close their files, so they go last: they still record the final evaluation and
        # checkpoint, and every other callback's on_train_end sees those results.
        for c in sorted(self.callbacks, key=lambda c: c.closes_at_end):
            c.on_train_end(trainer)


def load_callback(spec: str) -> Callback:
    """'package.module:ClassName' -> an instance (the config names trusted user code, as a script would)."""
    module_name, _, class_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"train.callbacks: cannot load {spec!r}: {e}") from None
    instance = cls()
    if not isinstance(instance, Callback):
        raise ValueError(f"train.callbacks: {spec!r} is not a shardstream.train.Callback subclass")
    return instance


# -- built-in callbacks ---------------------------------------------------------------------------


class JsonlLogger(Callback):
    """One JSON object per line in ``output_dir/log.jsonl``: every step, evaluation and checkpoint.
    Step records are written on logging steps (``on_log``), all of them, with their losses."""

    closes_at_end = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: TextIO | None = None

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in on_train_end
            self._write({"type": "start", "time": time.time(), **trainer.summary()})

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._write({"type": "step", **record})

    def on_epoch_end(self, trainer: Trainer, stats: dict[str, Any]) -> None:
        self._write({"type": "epoch", "step": trainer.step, **stats})

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self._write({"type": "eval", "step": trainer.step, "epoch": trainer.epoch, **metrics})

    def on_checkpoint(self, trainer: Trainer, path: str | None) -> None:
        self._write({"type": "checkpoint", "step": trainer.step, "path": path})

    def on_train_end(self, trainer: Trainer) -> None:
        self._write(
            {"type": "end", "step": trainer.step, "finished": trainer.finished, "wall_s": trainer.wall_time()}
        )
        if self.file is not None:
            self.file.close()
            self.file = None


class TensorBoardLogger(Callback):
    """TensorBoard scalars under ``output_dir/tensorboard`` (train/*, eval/*)."""

    closes_at_end = True

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writer: Any = None

    KEYS = LOGGED_KEYS

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # deps.check normally says so before the run starts
                raise RuntimeError(
                    f"log.tensorboard needs the tensorboard package ({e}): pip install 'shardstream[train]', "
                    "or turn it off: --log.tensorboard false"
                ) from None

            self.writer = SummaryWriter(str(self.directory))

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        if self.writer is not None:
            for metrics in records:
                for key in self.KEYS:
                    if key in metrics:
                        self.writer.add_scalar(f"train/{key}", metrics[key], metrics["step"])

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"eval/{key}", value, trainer.step)
            self.writer.flush()

    def on_train_end(self, trainer: Trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _format_step(m: dict[str, Any]) -> str:
    line = (
        f"loss {m['loss']:.4f}  lr {m['lr']:.3g}  {m['samples_per_s']:,.0f} samples/s  "
        f"input {100 * m['input_frac']:.0f}%"
    )
    if "input_frac_max" in m:  # a window's last step: the slowest rank beside the mean
        line += (
            f" (ranks: max {100 * m['input_frac_max']:.0f}% on {m['input_frac_max_rank']}, "
            f"mean {100 * m['input_frac_mean']:.0f}%)  wall {m['samples_per_s_wall']:,.0f} samples/s"
        )
    if "loss_scale" in m:
        line += f"  loss scale {m['loss_scale']:g}  skipped {m['skipped_steps']}"
    return line


class ConsoleLogger(Callback):
    """A progress bar on a terminal (rank 0), else one line every ``log.every_steps`` steps."""

    closes_at_end = True

    def __init__(self, every_steps: int, progress: bool, stream: TextIO | None = None) -> None:
        self.every_steps = every_steps
        self.progress = progress
        self.stream = stream or sys.stdout
        self.bar: Any = None

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.is_main and self.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=trainer.total_steps,
                initial=trainer.step,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def on_step_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if trainer.is_main and self.bar is not None:
            self.bar.update(1)

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        if not trainer.is_main or not records:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(_format_step(records[-1]), refresh=False)
            return
        for metrics in records:
            if metrics["step"] % self.every_steps == 0 or metrics["step"] == trainer.total_steps:
                print(
                    f"step {metrics['step']}/{trainer.total_steps}  epoch {metrics['epoch']}  "
                    + _format_step(metrics),
                    file=self.stream,
                    flush=True,
                )

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if trainer.is_main:
            shown = "  ".join(
                f"{k} {v:.4f}" if v < 1.0 or "R@" in k or "zeroshot" in k else f"{k} {v:g}"
                for k, v in metrics.items()
            )
            self._print(f"eval @ step {trainer.step}: {shown}")

    def on_checkpoint(self, trainer: Trainer, path: str | None) -> None:
        if trainer.is_main:
            self._print(f"checkpoint @ step {trainer.step}: {path}")

    def on_epoch_end(self, trainer: Trainer, stats: dict[str, Any]) -> None:
        lost = {k: stats[k] for k in ("skipped_total", "replaced", "padded", "retries") if stats.get(k)}
        if trainer.is_main and lost:  # a clean epoch says nothing; problems are always shown
            self._print(
                f"epoch {stats['epoch']}: {stats['samples']} samples; "
                + ", ".join(f"{k} {v}" for k, v in lost.items())
            )

    def on_train_end(self, trainer: Trainer) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if trainer.is_main:
            state = "finished" if trainer.finished else "stopped early"
            self._print(f"training {state} at step {trainer.step} after {trainer.wall_time():.1f} s")

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)


class Evaluator(Callback):
    """Evaluates every ``eval.every_steps`` steps and when training finishes."""

    def __init__(self, every_steps: int, at_end: bool) -> None:
        self.every_steps = every_steps
        self.at_end = at_end
        self.last_step = -1

    def on_step_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.every_steps and trainer.step % self.every_steps == 0:
            trainer.evaluate()
            self.last_step = trainer.step

    def on_train_end(self, trainer: Trainer) -> None:
        if self.at_end and trainer.finished and self.last_step != trainer.step:
            trainer.evaluate()
            self.last_step = trainer.step


class Checkpointer(Callback):
    """Writes a checkpoint every ``checkpoint.every_steps`` steps and at the end of the run
    (always when the run stops early, so that it can be resumed)."""

    def __init__(self, every_steps: int, at_end: bool) -> None:
        self.every_steps = every_steps
        self.at_end = at_end
        self.last_step = -1

    def on_train_start(self, trainer: Trainer) -> None:
        self.last_step = trainer.step  # a resumed run already has this step on disk

    def on_step_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.every_steps and trainer.step % self.every_steps == 0:
            trainer.save_checkpoint()
            self.last_step = trainer.step

    def on_train_end(self, trainer: Trainer) -> None:
        if (self.at_end or not trainer.finished) and self.last_step != trainer.step:
            trainer.save_checkpoint()
            self.last_step = trainer.step
