"""The ``shardstream`` command: validate, index, inspect and write WebDataset shards, and train
(``shardstream train``: the CLIP trainer, ``shardstream.train.cli``).

Exit status (all verbs): 0 success; 1 the data has problems (invalid samples found, or
``inspect`` hit a corrupt shard); 2 bad usage, an unreadable input or a missing dependency.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import index, inspect, subset, validate, write
from .common import EXIT_USAGE, Formatter, UsageError, package_version, parse_size, print_err

__all__ = ["build_parser", "main", "parse_size"]

# One module a verb, in the order the help lists them.
_VERB_MODULES = (validate, index, subset, inspect, write)

_MAIN_EPILOG = """\
examples:
  shardstream validate 'data/shard-{000000..000099}.tar' --json report.json
  shardstream index 's3://bucket/laion/{000000..000999}.tar' -o laion.index
  shardstream inspect https://example.com/shard-000000.tar -n 3
  shardstream write photos/ -o 'shards/shard-%06d.tar' --max-count 10000 --resize 512
  shardstream train --config vit_b32 --data.train 'SHARDS' --data.train_index IDX
  shardstream VERB --help      # options and examples of each verb

exit status: 0 success, 1 invalid data found, 2 bad usage or unreadable input
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardstream",
        formatter_class=Formatter,
        description="Validate, index, inspect and write WebDataset shards (paths, http(s)://, s3://).",
        epilog=_MAIN_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"shardstream {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for module in _VERB_MODULES:
        module.add_parser(verbs)
    # Listed here for the help; main() hands its arguments to the trainer's own parser.
    verbs.add_parser(
        "train",
        add_help=False,
        help="train a CLIP model on shards (shardstream train --help; torchrun -m shardstream.train)",
    )
    return parser


_VERBS = {
    "validate": validate.cmd_validate,
    "index": index.cmd_index,
    "subset": subset.cmd_subset,
    "inspect": inspect.cmd_inspect,
    "write": write.cmd_write,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``shardstream ARGV`` (default: ``sys.argv[1:]``) and returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from shardstream.train.cli import main as train_main

        return train_main(argv[1:], prog="shardstream train")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) and usage errors (2) from argparse
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    from ..errors import ShardError

    try:
        return _VERBS[args.verb](args)
    except UsageError as e:
        print_err(args.verb, str(e))
        return EXIT_USAGE
    except (ShardError, FileNotFoundError, ValueError, ImportError, RuntimeError) as e:
        print_err(args.verb, str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print_err(args.verb, "interrupted")
        return 130
