"""``shardstream index``: the dataset index written from a scan of the shards (only the new or
changed ones when -o already holds an index), from img2dataset's stats, or rewritten from an
old index; under torchrun each rank scans its share and rank 0 writes."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .._system import launch_rank_world
from ..progress import Progress, human_bytes
from ..urls import Shard
from ..validation import ScanOptions
from . import text_corpus
from .common import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    URL_HELP,
    UsageError,
    add_scan_options,
    add_verb,
    expand_specs,
    print_err,
    scan_options,
    scan_with_progress,
)

_DESCRIPTION = """\
Write the dataset index: per shard its URL, size, sample count, per-sample byte offsets and
the invalid samples found while indexing, so that training skips them deterministically and
every rank agrees on the epoch. Validates while indexing (decoding every image) unless
--no-decode. -o names a folder: manifest.bin, what every rank loads (a few dozen bytes per
shard), and detail files with each shard's offsets and keys, read per shard when it is opened.
An -o ending in .json or .json.gz writes the version-1 single file instead (small datasets).

Each shard's content identity is recorded (size and mtime of a file, the ETag of an http(s) or
s3 object). Re-running on a folder index that -o already holds scans only the shards that are
new or changed since (--rebuild scans all), keeps the others' entries, and drops shards no
longer listed; the shard order is the order of the URLs.

Under torchrun (RANK/WORLD_SIZE set) each rank scans its share of the shards to scan, and rank 0
writes the index; every rank exits with rank 0's status.

With --tokenizer the URLs are a text corpus and -o gets its token counts (one file) instead, the
same way: token counts already at -o, made under the same settings, keep the units of the files
whose content identity is unchanged (only new or changed files are read, removed ones dropped;
--rebuild reads all), and under torchrun each rank counts its share of the files and rank 0
writes the counts, identical to a one-process count.
"""

_EPILOG = """\
examples:
  shardstream index 'shards/{000000..000099}.tar' -o shards.index
  shardstream index 's3://bucket/data/{000000..000999}.tar' -o data.index --no-decode --threads 32
  shardstream index --from-index old-index.json -o data.index
  shardstream index 'shards/{000000..000199}.tar' -o shards.index   # again, grown: scans the new ones
  torchrun --nproc_per_node=8 -m shardstream index 's3://bucket/data/{000000..009999}.tar' -o data.index
  shardstream index 'fineweb/*.parquet' --tokenizer tokenizer.json --text-key text -o fineweb.tokens.json.gz
  torchrun --nproc_per_node=8 -m shardstream index 'fineweb/*.parquet' --tokenizer tok.json -o fw.tokens.json

exit status: 0 index written, 1 no valid sample left (every shard failed or every sample is
invalid: no index written, the reason printed), 2 a shard could not be read (no index written)
or bad usage
"""


def add_parser(verbs: argparse._SubParsersAction) -> None:
    p = add_verb(verbs, "index", "write the dataset index (exact epochs)", _DESCRIPTION, _EPILOG)
    p.add_argument("urls", nargs="*", metavar="URL", help=URL_HELP)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="INDEX",
        help="where to write it: a folder (manifest + detail files), or NAME.json[.gz] for the "
        "version-1 single file",
    )
    p.add_argument(
        "--from-index",
        metavar="OLD",
        default=None,
        help="rewrite an existing index (e.g. version-1 JSON) in the layout -o names, scanning nothing",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="scan every shard, ignoring the folder index (or with --tokenizer the token counts) already "
        "at -o (by default its shards whose content identity is unchanged are reused; rebuild after "
        "changing what a valid sample is)",
    )
    p.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="ignore RANK/WORLD_SIZE and index every shard in this process",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="index a file that is neither a tar nor a Parquet file as a shard of 0 samples, with a "
        "warning (by default it is an error, exit status 2)",
    )
    p.add_argument(
        "--from-img2dataset-stats",
        action="store_true",
        help="read sample counts from img2dataset's NNNNN_stats.json next to each shard "
        "instead of scanning (no offsets, nothing validated ahead)",
    )
    add_scan_options(p)
    text_corpus.add_text_options(p)


def cmd_index(args: argparse.Namespace) -> int:
    if args.tokenizer is not None:
        return text_corpus.cmd_index(args)
    if args.from_index is not None:
        return _on_rank_zero(args, lambda: _rewrite_index(args))
    if not args.urls:
        raise UsageError("give the shards to index (URL...), or --from-index OLD")
    shards = expand_specs(args.urls)
    if args.from_img2dataset_stats:
        return _on_rank_zero(args, lambda: _index_from_stats(args, shards))
    return _scan_index(args, shards)


def _scan_index(args: argparse.Namespace, shards: list[Shard]) -> int:
    """Scans the shards into the index -o names: under torchrun each rank probes and scans its
    share and rank 0 writes the index. With a folder index already at -o (and no --rebuild),
    shards it holds with the same content identity are kept from it and only the others are
    scanned: every rank gets rank 0's split, and only the shards to scan are divided."""
    from shardstream._rank_group import RankGroup, SoloGroup, share

    from ..errors import ShardError
    from ..identity import UNKNOWN, ShardIdentity
    from ..index import existing_index, index_name, plan_update
    from ..validation import default_threads

    start = time.perf_counter()
    options = scan_options(args)
    rank, world = launch_rank_world() if args.distributed else (0, 1)
    threads = args.threads or default_threads(shards, decode=options.decode)
    quiet = args.quiet or rank != 0
    urls = [index_name(s) for s in shards]
    with SoloGroup() if world == 1 else RankGroup(rank, world) as group:
        probing = share(shards, rank, world)
        found = _probe_with_progress([s for _, s in probing], quiet=quiet)
        probed = group.gather_json(
            [[i, f.size, f.identity] for (i, _), f in zip(probing, found, strict=True)]
        )
        identities: list[ShardIdentity] = [UNKNOWN] * len(shards)
        old, plan = None, None
        decision: dict[str, Any] | None = None
        if probed is not None:  # rank 0: decides what to scan, from its own view of -o
            for part in probed:
                for i, size, identity in part:
                    identities[i] = ShardIdentity(size, identity)
            try:
                old = None if args.rebuild else existing_index(args.output)
            except ShardError as e:
                print_err(
                    "index", f"cannot read the index already in {args.output}: {e} (--rebuild replaces it)"
                )
                decision = {"error": True}
            else:
                plan = plan_update(old, urls, identities)
                decision = {"scan": plan.scan}
        decision = group.broadcast_json(decision)
        if "error" in decision:
            return EXIT_USAGE
        scanning = share(decision["scan"], rank, world)
        local, _ = scan_with_progress(
            "index", [shards[i] for _, i in scanning], options, threads, quiet=quiet, keep_offsets=True
        )
        scanned = group.gather_json([[i, r] for (_, i), r in zip(scanning, local, strict=True)])
        status = EXIT_OK
        if scanned is not None:  # rank 0: merges in the order of the URL list, writes the index
            status = _finish_index(
                args, options, plan, old, urls, identities, scanned, time.perf_counter() - start
            )
        # Every rank exits with rank 0's status, and only once the index is written.
        return group.broadcast_int(status)


def _probe_with_progress(shards: Sequence[Shard], *, quiet: bool) -> list[Any]:
    from ..identity import probe_identities

    with Progress(
        "index: content identities", total=len(shards), enabled=False if quiet else None
    ) as progress:
        return probe_identities(shards, on_done=progress.advance)


def _finish_index(
    args: argparse.Namespace,
    options: ScanOptions,
    plan: Any,
    old: Any,
    urls: list[str],
    identities: list[Any],
    scanned: list[Any],
    elapsed: float,
) -> int:
    from ..index import assemble_update, with_identities, write_index
    from ..validation import is_not_a_shard, is_unreadable

    reports_at = {i: report for part in scanned for i, report in part}
    results = [reports_at[i] for i in plan.scan]
    unreadable = [r for r in results if is_unreadable(r)]
    if unreadable:
        for r in unreadable:
            print_err("index", f"cannot read {r['url']}: {r['fatal']['detail']}")
        print_err(
            "index",
            f"{len(unreadable)} of {len(urls)} shards unreadable: no index written "
            "(an index without them would silently drop their samples)",
        )
        return EXIT_USAGE
    strangers = [r for r in results if is_not_a_shard(r)]
    if strangers and not args.keep_going:
        for r in strangers:
            print_err(
                "index",
                f"{r['url']} is not a shard (neither a tar nor a Parquet file): {r['fatal']['detail']}",
            )
        print_err(
            "index",
            f"{len(strangers)} file(s) not shards: no index written (--keep-going indexes them as empty)",
        )
        return EXIT_USAGE
    with_identities(results, [identities[i] for i in plan.scan])
    try:
        index = assemble_update(plan, old, urls, results)
        if len(index) and index.num_valid == 0 and _report_nothing_valid(results):
            return EXIT_INVALID
        write_index(index, args.output)
    except (OSError, ValueError) as e:
        print_err("index", f"cannot write the index: {e}")
        return EXIT_USAGE
    if not args.quiet:
        print(
            f"indexed {len(index):,} shards, {index.num_samples:,} samples -> {args.output} "
            f"(scanned {human_bytes(sum(r['bytes'] for r in results))} in {elapsed:.1f} s)"
        )
        print(
            f"shards: {len(plan.reuse):,} reused (unchanged since indexed), {len(plan.scan):,} scanned "
            f"(new or changed), {len(plan.dropped):,} dropped (no longer listed)"
        )
        for url in plan.dropped[:10]:
            print(f"  dropped: {url}")
        if len(plan.dropped) > 10:
            print(f"  ... and {len(plan.dropped) - 10:,} more dropped")
        mode = "decoded" if options.decode else "structure only"
        invalid = index.num_samples - index.num_valid
        print(f"invalid samples recorded ({mode}, skipped by training): {invalid:,}")
        for r in results:
            if r["fatal"]:
                print(
                    f"  warning: {r['url']}: {r['fatal']['reason']}: {r['fatal']['detail']} "
                    f"(indexed the {r['samples']:,} samples before it)"
                )
    return EXIT_OK


def _report_nothing_valid(results: list[dict[str, Any]]) -> bool:
    """Prints why an index would schedule no sample (the most frequent reason first, with a
    shard's detail for it) when the scan found reasons; returns whether it did. Such an index is
    not written: the loader could only fail on it ("the index schedules no sample")."""
    shard_reasons = Counter(r["fatal"]["reason"] for r in results if r["fatal"])
    sample_reasons = Counter(item["reason"] for r in results for item in r["invalid"])
    if not shard_reasons and not sample_reasons:
        return False
    # A shard-level reason (a missing column) weighs by the shards it failed; samples by samples.
    reason, count = max((shard_reasons + sample_reasons).items(), key=lambda item: (item[1], item[0]))
    what = "shards" if reason in shard_reasons else "samples"
    failed = [r for r in results if r["fatal"] and r["fatal"]["reason"] == reason]
    example = next((f"{r['url']}: {r['fatal']['detail']}" for r in failed), None) or next(
        f"{r['url']} key {item['key']!r}: {item['detail']}"
        for r in results
        for item in r["invalid"]
        if item["reason"] == reason
    )
    print_err(
        "index",
        f"no valid sample: {reason} ({count:,} {what}) left nothing to index; no index written. "
        f"e.g. {example}",
    )
    for other, n in sorted((shard_reasons + sample_reasons).items()):
        if other != reason:
            print_err("index", f"  also {other}: {n:,}")
    return True


def _index_from_stats(args: argparse.Namespace, shards: list[Shard]) -> int:
    from ..errors import ShardError
    from ..index import index_from_img2dataset, write_index

    try:
        index = index_from_img2dataset([s.display for s in shards])
    except ShardError as e:
        raise UsageError(str(e)) from None
    write_index(index, args.output)
    if not args.quiet:
        print(
            f"indexed {len(index):,} shards, {index.num_samples:,} samples "
            f"from img2dataset stats -> {args.output}"
        )
    return EXIT_OK


def _on_rank_zero(args: argparse.Namespace, work: Any) -> int:
    """Runs ``work`` (no scan to share) on rank 0 only under torchrun; every rank exits with its
    status."""
    from shardstream._rank_group import RankGroup

    from ..errors import ShardError

    rank, world = launch_rank_world() if args.distributed else (0, 1)
    if world == 1:
        return int(work())
    with RankGroup(rank, world) as group:
        status = EXIT_OK
        if rank == 0:
            try:
                status = int(work())
            except (UsageError, ShardError, OSError, ValueError) as e:  # main() would print it
                print_err(args.verb, str(e))
                status = EXIT_USAGE
        return group.broadcast_int(status)


def _rewrite_index(args: argparse.Namespace) -> int:
    from ..errors import ShardError
    from ..index import load_index, write_index

    if args.urls or args.from_img2dataset_stats:
        raise UsageError("--from-index rewrites an index: give no URL and no --from-img2dataset-stats")
    try:
        index = load_index(args.from_index)
    except ShardError as e:
        raise UsageError(str(e)) from None
    if index.has_detail_files:
        raise UsageError(f"{args.from_index} is already in the folder layout; rewriting one is not supported")
    write_index(index, args.output)
    if not args.quiet:
        print(f"rewrote {len(index):,} shards, {index.num_samples:,} samples -> {args.output}")
    return EXIT_OK
