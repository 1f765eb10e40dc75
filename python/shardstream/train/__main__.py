"""``python -m shardstream.train`` and ``torchrun -m shardstream.train``: the trainer's command line
(``shardstream.train.cli``)."""

from shardstream.train.cli import main

raise SystemExit(main(prog="python -m shardstream.train"))
