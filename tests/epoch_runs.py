"""One rank's epoch through ShardLoader, as the exact-epoch tests read it: the keys of every
batch, and where asked the state after ``stop_after`` batches."""

from __future__ import annotations

import shardstream


def run(paths, index, *, rank, world, batch=4, seed=0, epoch=0, state=None, stop_after=None, **kw):
    loader = shardstream.ShardLoader(
        paths,
        index=index,
        batch_size=batch,
        image_size=32,
        seed=seed,
        rank=rank,
        world_size=world,
        shuffle_buffer=5,
        threads=1,
        **kw,
    )
    loader.set_epoch(epoch)
    if state is not None:
        loader.load_state_dict(state)
    batches = []
    for b in loader:
        batches.append(list(b.keys))
        if stop_after is not None and len(batches) == stop_after:
            return batches, loader.state_dict(), loader
    return batches, None, loader
