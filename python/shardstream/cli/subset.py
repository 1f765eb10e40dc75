"""``shardstream subset``: the index of the samples that match keys, uids or a metadata filter;
under torchrun each rank reads the metadata of its share of the shards."""

from __future__ import annotations

import argparse
import time

from .._system import launch_rank_world
from ..progress import Progress
from .common import EXIT_OK, EXIT_USAGE, UsageError, add_verb, print_err

_DESCRIPTION = """\
Writes the index of a subset of an indexed dataset: the samples whose key is in --keys, whose
uid is in --uids, and whose metadata passes --filter (all that are given). The shards stay
where they are and as they are: training with the subset's index reads only the kept samples
(each shard's kept ordinals are in the subset's detail blocks; its manifest holds per shard the
count kept, so every rank still loads O(shards)). Prints how many samples each condition keeps.
"""

_EPILOG = """\
examples:
  shardstream subset pool.index -o small.index --uids datacomp_small_uids.npy
  shardstream subset pool.index -o filtered.index --filter 'similarity >= 0.28 and width >= 200'
  shardstream subset laion.index -o big.index --metadata parquet --filter 'width >= 512'
  torchrun --nproc_per_node=8 -m shardstream subset s3://b/pool.index -o /data/sub.index --uids uids.npy
"""


def add_parser(verbs: argparse._SubParsersAction) -> None:
    p = add_verb(
        verbs,
        "subset",
        "an index of the samples matching keys, uids or a filter",
        _DESCRIPTION,
        _EPILOG,
    )
    p.add_argument("index", metavar="INDEX", help="the index of the whole dataset (shardstream index -o)")
    p.add_argument(
        "-o", "--output", required=True, metavar="SUBSET", help="folder to write the subset's index to"
    )
    p.add_argument("--keys", metavar="FILE", help="keep samples whose key is listed (one per line)")
    p.add_argument(
        "--uids",
        metavar="FILE",
        help="keep samples whose uid is listed: DataComp's .npy of 128-bit uids, a .parquet with a "
        "'uid' column, or one uid (32 hex digits) per line",
    )
    p.add_argument(
        "--filter",
        metavar="EXPR",
        help="keep samples whose metadata passes EXPR: fields, constants, comparisons, and/or/not, "
        "e.g. 'similarity >= 0.28 and width >= 200'",
    )
    p.add_argument(
        "--metadata",
        choices=("json", "parquet"),
        default="json",
        help="where fields come from: each sample's json member, or img2dataset's NNNNN.parquet "
        "beside each shard, joined by key (default: json)",
    )
    p.add_argument("--threads", type=int, default=None, metavar="N", help="shards read at once")
    p.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="ignore RANK/WORLD_SIZE and read every shard's metadata in this process",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def cmd_subset(args: argparse.Namespace) -> int:
    """Writes the subset of an index that keeps the samples matching --keys, --uids and
    --filter; under torchrun each rank reads the metadata of its share of the shards."""
    from shardstream._rank_group import RankGroup, SoloGroup, share

    from ..index import is_json_index_path, load_index, write_index
    from ..subset import Selector, SubsetReport, check_selected, select
    from ..urls import index_source_config

    start = time.perf_counter()
    if args.keys is None and args.uids is None and args.filter is None:
        raise UsageError("give --keys, --uids or --filter (or several: a sample must match all)")
    if is_json_index_path(args.output):
        raise UsageError("-o: a subset is written as a folder index (manifest + detail), not JSON")
    selector = Selector.make(keys=args.keys, uids=args.uids, filter=args.filter, metadata=args.metadata)
    index = load_index(args.index)
    config = index_source_config(None, {}, schemes=index.schemes())
    rank, world = launch_rank_world() if args.distributed else (0, 1)
    with SoloGroup() if world == 1 else RankGroup(rank, world) as group:
        mine = [i for _, i in share(list(range(len(index))), rank, world)]
        shown = None if rank == 0 and not args.quiet else False
        with Progress("subset", total=len(mine), items="samples kept", enabled=shown) as progress:
            kept, report = select(
                index, selector, shards=mine, threads=args.threads, config=config, progress=progress
            )
        gathered = group.gather_json([[[i, kept[i]] for i in mine], report.to_json()])
        status = EXIT_OK
        if gathered is not None:  # rank 0: merges, checks, writes
            chosen: dict[int, list[int]] = {}
            total = SubsetReport()
            for part_kept, part_report in gathered:
                chosen.update({int(i): k for i, k in part_kept})
                total.merge(SubsetReport.from_json(part_report))
            total.uids_given = report.uids_given
            try:
                check_selected(selector, total)
                subset = index.with_selections([chosen[i] for i in range(len(index))], config)
                write_index(subset, args.output)
            except (OSError, ValueError) as e:
                print_err("subset", str(e))
                status = EXIT_USAGE
            else:
                if not args.quiet:
                    for line in total.lines():
                        print(line)
                    print(
                        f"subset of {len(index):,} shards -> {args.output} "
                        f"({time.perf_counter() - start:.1f} s; the shards are read where they are)"
                    )
        return group.broadcast_int(status)
