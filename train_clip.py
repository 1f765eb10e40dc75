"""Train a CLIP model on WebDataset shards streamed by shardstream.

    torchrun --nproc_per_node=N train_clip.py [--config configs/X.yaml] [--resume latest]
                                              [--section.field VALUE ...]

With no arguments it runs the small CPU demo (configs/demo_cpu.yaml) on an embedded dataset that
it generates under data/demo on first use. All the logic lives in shardstream.train.
"""

from pathlib import Path

from shardstream.train.cli import main

if __name__ == "__main__":
    default = Path(__file__).resolve().parent / "configs" / "demo_cpu.yaml"
    raise SystemExit(main(default_config=default if default.is_file() else None))
