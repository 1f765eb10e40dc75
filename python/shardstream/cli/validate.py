"""``shardstream validate``: every shard and sample checked, a summary printed and, with
``--json``, every invalid sample reported; under torchrun each rank checks its share."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .._files import atomic_write_json
from .._system import launch_rank_world
from ..validation import ScanOptions
from . import text_corpus
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    URL_HELP,
    add_scan_options,
    add_verb,
    expand_specs,
    package_version,
    print_err,
    scan_options,
    scan_with_progress,
)

_DESCRIPTION = """\
Check every shard and sample in parallel: tar structure, sample grouping, duplicate keys,
required members, UTF-8 captions and (unless --no-decode) the decoding of every image.
Prints a summary; --json writes every invalid sample with its shard, key and reason.

Under torchrun (RANK/WORLD_SIZE set) each rank checks its share of the shards, and rank 0
prints and writes the merged report; every rank exits with the merged status.
"""

_EPILOG = """\
examples:
  shardstream validate 'shards/{000000..000099}.tar'
  shardstream validate shards/*.tar --json report.json --threads 8
  shardstream validate https://host/data/shard-000000.tar --no-decode
  shardstream validate 's3://bucket/data/{000000..000999}.tar' --json report.json
  shardstream validate mnist.tgz --caption-key cls        # a label member instead of a caption
  shardstream validate images-only.tar --require image    # no caption needed
  shardstream validate 'code/*.tar' --tokenizer tokenizer.json --text-key py   # a text corpus
  torchrun --nproc_per_node=8 -m shardstream validate 's3://bucket/{000000..009999}.tar' \\
      --json report.json

exit status: 0 all valid, 1 invalid samples found, 2 unreadable input or bad usage
"""


def add_parser(verbs: argparse._SubParsersAction) -> None:
    p = add_verb(
        verbs,
        "validate",
        "check every shard and sample, report invalid ones",
        _DESCRIPTION,
        _EPILOG,
    )
    p.add_argument("urls", nargs="+", metavar="URL", help=URL_HELP)
    p.add_argument("--json", metavar="REPORT", help="write the full report (every invalid sample) here")
    p.add_argument("--worst", type=int, default=10, metavar="N", help="worst shards listed (default: 10)")
    p.add_argument(
        "--show",
        type=int,
        default=10,
        metavar="N",
        help="invalid samples printed in the summary (default: 10)",
    )
    p.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="ignore RANK/WORLD_SIZE and check every shard in this process",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result line")
    add_scan_options(p)
    text_corpus.add_text_options(p)


def cmd_validate(args: argparse.Namespace) -> int:
    if args.tokenizer is not None:
        return text_corpus.cmd_validate(args)
    from shardstream._rank_group import RankGroup, share

    from ..validation import default_threads

    start = time.perf_counter()
    options = scan_options(args)
    shards = expand_specs(args.urls)
    rank, world = launch_rank_world() if args.distributed else (0, 1)
    threads = args.threads or default_threads(shards, decode=options.decode)
    if world == 1:
        results, elapsed = scan_with_progress("validate", shards, options, threads, quiet=args.quiet)
        return _finish_validate(args, options, results, elapsed)

    mine = share(shards, rank, world)
    with RankGroup(rank, world) as group:
        local, _ = scan_with_progress(
            "validate", [u for _, u in mine], options, threads, quiet=args.quiet or rank != 0
        )
        gathered = group.gather_json([[i, r] for (i, _), r in zip(mine, local, strict=True)])
        status = EXIT_OK
        if gathered is not None:  # rank 0: merge in the order of the URL list, report
            merged = sorted((pair for part in gathered for pair in part), key=lambda pair: pair[0])
            try:
                status = _finish_validate(
                    args, options, [r for _, r in merged], time.perf_counter() - start, world=world
                )
            except OSError as e:
                print_err("validate", f"cannot write report: {e}")
                status = EXIT_USAGE
        # Every rank exits with the merged status, and only after rank 0 has written the report
        # (torchrun stops the other ranks as soon as one exits with an error).
        return group.broadcast_int(status)


def _finish_validate(
    args: argparse.Namespace,
    options: ScanOptions,
    results: list[dict[str, Any]],
    elapsed: float,
    *,
    world: int = 1,
) -> int:
    from ..validation import build_report, format_summary

    report = build_report(results, options, elapsed=elapsed, version=package_version())
    if world > 1:
        report["world_size"] = world
    if args.json:
        atomic_write_json(args.json, report)
    summary = format_summary(report, worst=args.worst, show=args.show)
    print(summary.splitlines()[-1] if args.quiet else summary)
    return int(report["exit_status"])
