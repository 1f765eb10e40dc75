"""The ``shardstream`` command: validate, index, inspect and write WebDataset shards.

Exit status (all verbs): 0 success; 1 the data has problems (invalid samples found, or
``inspect`` hit a corrupt shard); 2 bad usage, an unreadable input or a missing dependency.
"""

from __future__ import annotations

import argparse
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
    return parser


_VERBS = {
    "validate": validate.cmd_validate,
    "index": index.cmd_index,
    "subset": subset.cmd_subset,
    "inspect": inspect.cmd_inspect,
    "write": write.cmd_write,
}


def main(argv: Sequence[str] | None = None) -> int:
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
