"""Train a CLIP model on WebDataset shards streamed by shardstream: the one-file entry point.

    torchrun --nproc_per_node=N train_clip.py [--config NAME|PATH] [--resume latest]
                                              [--section.field VALUE ...]

The same command as ``shardstream train`` and ``torchrun -m shardstream.train``. ``--config``
takes a YAML file or the name of a config shipped in the package (``vit_b32``, ``siglip_b16``...;
``--help`` lists them). With no arguments it runs the small CPU demo (``demo_cpu``) on an embedded
dataset that it generates under data/demo on first use. All the logic lives in shardstream.train.
"""

from shardstream.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main(prog="train_clip.py"))
