"""Weights & Biases logging (``log.wandb: true``), on rank 0 only.

The run id is kept in every checkpoint, so a resumed run continues the same wandb run
(``resume="allow"``: the same id, the steps after the checkpoint's appended to its history)
instead of starting a new one. ``WANDB_MODE=offline`` writes the run under
``output_dir/wandb/`` for ``wandb sync`` later; the API key comes from wandb's own sources
(``WANDB_API_KEY``, ``wandb login``) and is never in the config or the logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardstream.train.callbacks import Callback
from shardstream.train.metrics import LOGGED_KEYS

if TYPE_CHECKING:
    from shardstream.train.loop import Trainer


class WandbLogger(Callback):
    closes_at_end = True

    def __init__(self, project: str, name: str = "", entity: str = "", tags: list[str] | None = None) -> None:
        self.project, self.name, self.entity = project, name, entity
        self.tags = list(tags or [])
        self.run: Any = None

    def on_train_start(self, trainer: Trainer) -> None:
        if not trainer.is_main:
            return
        try:
            import wandb
        except ImportError as e:  # deps.check normally says so before the run starts
            raise RuntimeError(
                f"log.wandb needs the wandb package ({e}): pip install wandb, "
                "or turn it off: --log.wandb false"
            ) from None
        self.run = wandb.init(
            project=self.project,
            name=self.name or None,
            entity=self.entity or None,
            tags=self.tags or None,
            id=trainer.wandb_run_id,  # None: a new run, its id chosen by wandb
            resume="allow",
            dir=str(trainer.output_dir),
            config=trainer.cfg.to_dict(),
        )
        trainer.wandb_run_id = self.run.id

    def on_log(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        if self.run is None:
            return
        for record in records:
            values = {f"train/{k}": record[k] for k in LOGGED_KEYS if isinstance(record.get(k), (int, float))}
            self.run.log({**values, "epoch": record["epoch"]}, step=record["step"])

    def on_eval(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({f"eval/{k}": v for k, v in metrics.items()}, step=trainer.step)

    def on_train_end(self, trainer: Trainer) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


__all__ = ["WandbLogger"]
