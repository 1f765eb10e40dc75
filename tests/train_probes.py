"""Probes for the trainer tests, as callbacks (no tests here; ``--train.callbacks
'[train_probes:NAME]'`` with this folder on the workers' PYTHONPATH, or passed to ``train``).

* ``CountDeviceReads``: counts, per step and per rank, the reads of a floating-point tensor's value
  on the host (``item``, ``tolist``, ``float()``, ``cpu``, ...): on a GPU each is a host sync,
  the step waiting for the device. Written to ``reads-RANK.json`` in the run folder.
* ``SlowTokenizer`` / ``SlowLoader``: ``SHARDSTREAM_TEST_DELAY_S`` seconds of sleep per
  tokenizer call / per batch the loader yields.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402
from shardstream.train.callbacks import Callback  # noqa: E402

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


class CountDeviceReads(Callback):
    def __init__(self) -> None:
        self.count = 0
        self.per_step: dict[int, int] = {}
        self.saved: dict[str, Any] = {}

    def on_train_start(self, trainer: Any) -> None:
        for name in READS:
            original = getattr(torch.Tensor, name)
            self.saved[name] = original

            def counting(t: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if t.is_floating_point():
                    self.count += 1
                return _original(t, *args, **kwargs)

            setattr(torch.Tensor, name, counting)
        self.count = 0

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        # the reads since the previous step's hooks: this step's work (and its logging, if due)
        self.per_step[trainer.step] = self.count
        self.count = 0

    def on_train_end(self, trainer: Any) -> None:
        for name, original in self.saved.items():
            setattr(torch.Tensor, name, original)
        path = Path(trainer.output_dir) / f"reads-{trainer.ctx.rank}.json"
        path.write_text(json.dumps(self.per_step))


def _delay() -> float:
    return float(os.environ.get("SHARDSTREAM_TEST_DELAY_S", "0.2"))


class SlowTokenizer(Callback):
    def on_train_start(self, trainer: Any) -> None:
        tokenizer, delay = trainer.bundle.tokenizer, _delay()

        def slow(texts: list[str]) -> torch.Tensor:
            time.sleep(delay)
            return tokenizer(texts)

        trainer.bundle.tokenizer = slow


class _SlowIterable:
    def __init__(self, loader: Any, delay: float) -> None:
        self.loader, self.delay = loader, delay

    def __iter__(self) -> Any:
        for batch in self.loader:
            time.sleep(self.delay)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # set_epoch, state_dict, stats, ...
        return getattr(self.loader, name)


class SlowLoader(Callback):
    def on_train_start(self, trainer: Any) -> None:
        trainer.loader = _SlowIterable(trainer.loader, _delay())


class HugeLossScale(Callback):
    """fp16 runs start from a loss scale of 2**40: the scaled gradients overflow float16, so the
    first steps are skipped while the scale halves."""

    def on_train_start(self, trainer: Any) -> None:
        trainer.scaler = torch.amp.GradScaler(trainer.ctx.device.type, init_scale=2.0**40)


class SaveFeatures(Callback):
    """At the end of the run, the trained model's normalised image and text features of fixed
    inputs (seeded noise images, three captions), through its forward (under FSDP a collective:
    the root's parameters are gathered only there), saved by rank 0 to ``features.pt``."""

    TEXTS = ("a red circle on the left", "a photo of a cat", "a drawing of a blue square on the right")

    def on_train_end(self, trainer: Any) -> None:
        size = trainer.image_size
        images = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(0))
        model = trainer.bundle.model.eval()
        with torch.no_grad():
            out = model(images.to(trainer.ctx.device), trainer.bundle.tokenizer(list(self.TEXTS)))
        if trainer.is_main:
            features = {"image": out["image_features"].cpu(), "text": out["text_features"].cpu()}
            torch.save(
                {"images": images, "texts": list(self.TEXTS), **features}, trainer.output_dir / "features.pt"
            )
