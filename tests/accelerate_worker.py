"""One process of a plain accelerate loop over shardstream.integrations.accelerate (run by
test_integration_accelerate.py under ``accelerate launch``): a small model on real-photo shards for
--epochs epochs (2); ``--save-at n`` calls save_state after n steps of the first epoch and goes on,
``--load`` restores such a state and continues from it. Each step's keys are logged."""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from integration_support import KeyLog, end_worker, make_loader
from shardstream.integrations.accelerate import prepare


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shards", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--keys-dir", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--load", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    loader = prepare(accelerator, make_loader(a.shards, a.index), num_workers=a.workers)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    log = KeyLog(a.keys_dir)
    start_epoch = 0
    if a.load:
        accelerator.load_state(a.state_dir)
        start_epoch = loader.epoch
    for epoch in range(start_epoch, a.epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader, start=1):
            log.write(batch.keys, loader.epoch)
            loss = model(batch.images.float() / 255).square().mean()
            accelerator.backward(loss)  # DDP's all_reduce: unequal batch counts would hang here
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 0 and step == a.save_at:
                accelerator.save_state(a.state_dir)


if __name__ == "__main__":
    main()
    end_worker()
