"""One rank of lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2) over
shardstream.integrations.lightning (run by test_integration_lightning.py under torchrun, gloo): a
small LightningModule for two epochs on real-photo shards, a checkpoint every 2 steps (and
last.ckpt). ``--kill-at n``: rank 1 SIGKILLs itself when step n begins; ``--ckpt`` resumes
(``--devices 1`` on another world size); ``--max-steps n`` stops after step n. Each training step's
keys and the loader's epoch are logged."""

from __future__ import annotations

import argparse
import os
import signal

import lightning
import torch
from integration_support import KeyLog, end_worker, make_loader
from lightning.pytorch.callbacks import ModelCheckpoint
from shardstream.integrations.lightning import ShardDataModule


class Tiny(lightning.LightningModule):
    def __init__(self, keys_dir: str, kill_at: int | None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 8))
        self.keys_dir, self.kill_at, self.log_file = keys_dir, kill_at, None

    def training_step(self, batch, batch_idx):
        if self.kill_at is not None and self.global_rank == 1 and self.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.log_file is None:
            self.log_file = KeyLog(self.keys_dir)
        self.log_file.write(batch.keys, self.trainer.datamodule.train_dataloader().epoch)
        return self.net(batch.images.float() / 255).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--keys-dir", required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    datamodule = ShardDataModule(lambda: make_loader(a.shards, a.index))
    checkpoints = ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=2, save_top_k=-1, save_last=True)
    trainer = lightning.Trainer(
        strategy="ddp", accelerator="cpu", devices=a.devices, max_epochs=a.max_epochs, max_steps=a.max_steps,
        callbacks=[checkpoints], logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(Tiny(a.keys_dir, a.kill_at), datamodule=datamodule, ckpt_path=a.ckpt)


if __name__ == "__main__":
    main()
    end_worker()
