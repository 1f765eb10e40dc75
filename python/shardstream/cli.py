"""The ``shardstream`` command: validate, index, inspect and write WebDataset shards.

Exit status (all verbs): 0 success; 1 the data has problems (invalid samples found, or
``inspect`` hit a corrupt shard); 2 bad usage, an unreadable input or a missing dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._files import atomic_write_json
from ._system import torchrun_rank_world
from .config import DEFAULTS
from .progress import Progress, human_bytes
from .urls import Shard
from .validation import ScanOptions

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or inputs: printed as one line, exit status 2."""


# -- helpers --------------------------------------------------------------------------------------


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardstream")
    except PackageNotFoundError:
        return "unknown"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_size(text: str) -> int:
    """'1000', '500MB', '1G', '1.5GiB' -> bytes (k/M/G/T are powers of 1000, KiB/MiB/GiB of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1000000, 500MB, 1GiB)")
    unit = (match.group(2) or "").lower().removesuffix("b")
    return int(float(match.group(1)) * _UNITS[unit])


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def size_text(n: int) -> str:
    """Bytes as ``parse_size`` reads them, in the largest binary unit that holds them exactly."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n and n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def comma_list(text: str) -> tuple[str, ...]:
    items = tuple(part.strip().lower().lstrip(".") for part in text.split(",") if part.strip())
    if not items:
        raise argparse.ArgumentTypeError("empty list")
    return items


def expand_specs(specs: Sequence[str]) -> list[Shard]:
    """Every URL spec (brace ranges, '::' lists, local paths, s3://) expanded, duplicates dropped."""
    from .errors import ShardError
    from .urls import expand_urls

    shards: dict[str, Shard] = {}
    for spec in specs:
        try:
            expanded = expand_urls(spec)
        except (ShardError, ValueError, OSError) as e:
            raise UsageError(str(e)) from None
        for shard in expanded:
            shards.setdefault(shard.url, shard)
    if not shards:
        raise UsageError("no shards: the URL arguments expanded to nothing")
    return list(shards.values())


def print_err(verb: str, message: str) -> None:
    print(f"shardstream {verb}: error: {message}", file=sys.stderr)


# -- argument parsing -----------------------------------------------------------------------------


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def _add_limit(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    parse: Callable[[str], int],
    default: int,
    metavar: str,
    what: str,
) -> None:
    """A numeric option whose help ends with its default, written as the option reads it."""
    shown = size_text(default) if parse is parse_size else str(default)
    parser.add_argument(flag, type=parse, default=default, metavar=metavar, help=f"{what} (default: {shown})")


def _add_scan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what a valid sample is")
    g.add_argument(
        "--no-decode",
        dest="decode",
        action="store_false",
        help="structure only (tar, grouping, required members, UTF-8, duplicates); skip image decoding",
    )
    g.add_argument(
        "--caption-key",
        default=DEFAULTS.caption_key,
        metavar="EXT",
        help=f"member holding the caption (default: {DEFAULTS.caption_key}); 'json:FIELD' reads FIELD "
        "of the json member",
    )
    g.add_argument(
        "--image-keys",
        type=comma_list,
        default=DEFAULTS.image_keys,
        metavar="EXT,...",
        help=f"image member extensions, tried in order (default: {','.join(DEFAULTS.image_keys)})",
    )
    g.add_argument(
        "--require",
        choices=("image,caption", "image"),
        default="image,caption",
        metavar="MEMBERS",
        help="members every sample must have: 'image,caption' (default) or 'image' (the caption "
        "becomes optional, for image-only or label datasets; present captions must still be UTF-8)",
    )
    _add_limit(
        g,
        "--max-pixels",
        parse=positive_int,
        default=DEFAULTS.max_pixels,
        metavar="N",
        what="reject images with more pixels, read from the header",
    )
    _add_limit(
        g,
        "--max-member-bytes",
        parse=parse_size,
        default=DEFAULTS.max_member_bytes,
        metavar="SIZE",
        what="reject members larger than this, unread",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="shards scanned at once (default: one per core, 4 per core for remote URLs)",
    )


def _scan_options(args: argparse.Namespace) -> ScanOptions:
    return ScanOptions(
        decode=args.decode,
        caption_key=args.caption_key,
        image_keys=tuple(args.image_keys),
        require_caption=args.require == "image,caption",
        max_pixels=args.max_pixels,
        max_member_bytes=args.max_member_bytes,
    )


_MAIN_EPILOG = """\
examples:
  shardstream validate 'data/shard-{000000..000099}.tar' --json report.json
  shardstream index 's3://bucket/laion/{000000..000999}.tar' -o laion.index
  shardstream inspect https://example.com/shard-000000.tar -n 3
  shardstream write photos/ -o 'shards/shard-%06d.tar' --max-count 10000 --resize 512
  shardstream VERB --help      # options and examples of each verb

exit status: 0 success, 1 invalid data found, 2 bad usage or unreadable input
"""

_VALIDATE_DESCRIPTION = """\
Check every shard and sample in parallel: tar structure, sample grouping, duplicate keys,
required members, UTF-8 captions and (unless --no-decode) the decoding of every image.
Prints a summary; --json writes every invalid sample with its shard, key and reason.

Under torchrun (RANK/WORLD_SIZE set) each rank checks its share of the shards, and rank 0
prints and writes the merged report; every rank exits with the merged status.
"""

_VALIDATE_EPILOG = """\
examples:
  shardstream validate 'shards/{000000..000099}.tar'
  shardstream validate shards/*.tar --json report.json --threads 8
  shardstream validate https://host/data/shard-000000.tar --no-decode
  shardstream validate 's3://bucket/data/{000000..000999}.tar' --json report.json
  shardstream validate mnist.tgz --caption-key cls        # a label member instead of a caption
  shardstream validate images-only.tar --require image    # no caption needed
  torchrun --nproc_per_node=8 -m shardstream validate 's3://bucket/{000000..009999}.tar' \\
      --json report.json

exit status: 0 all valid, 1 invalid samples found, 2 unreadable input or bad usage
"""

_INDEX_DESCRIPTION = """\
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
"""

_SUBSET_DESCRIPTION = """\
Writes the index of a subset of an indexed dataset: the samples whose key is in --keys, whose
uid is in --uids, and whose metadata passes --filter (all that are given). The shards stay
where they are and as they are: training with the subset's index reads only the kept samples
(each shard's kept ordinals are in the subset's detail blocks; its manifest holds per shard the
count kept, so every rank still loads O(shards)). Prints how many samples each condition keeps.
"""

_SUBSET_EPILOG = """\
examples:
  shardstream subset pool.index -o small.index --uids datacomp_small_uids.npy
  shardstream subset pool.index -o filtered.index --filter 'similarity >= 0.28 and width >= 200'
  shardstream subset laion.index -o big.index --metadata parquet --filter 'width >= 512'
  torchrun --nproc_per_node=8 -m shardstream subset s3://b/pool.index -o /data/sub.index --uids uids.npy
"""

_INDEX_EPILOG = """\
examples:
  shardstream index 'shards/{000000..000099}.tar' -o shards.index
  shardstream index 's3://bucket/data/{000000..000999}.tar' -o data.index --no-decode --threads 32
  shardstream index --from-index old-index.json -o data.index
  shardstream index 'shards/{000000..000199}.tar' -o shards.index   # again, grown: scans the new ones
  torchrun --nproc_per_node=8 -m shardstream index 's3://bucket/data/{000000..009999}.tar' -o data.index

exit status: 0 index written, 2 a shard could not be read (no index written) or bad usage
"""

_INSPECT_DESCRIPTION = """\
Show the first samples: key, members and their sizes, image format and dimensions (read
from the header) and the text of text members.
"""

_INSPECT_EPILOG = """\
examples:
  shardstream inspect shards/shard-000000.tar
  shardstream inspect https://host/data/shard-000000.tar -n 3 --json

exit status: 0 samples shown, 1 the shard is corrupt, 2 unreadable or bad usage
"""

_WRITE_DESCRIPTION = """\
Build shards from
  - a folder of images with captions of the same name: a.jpg + a.txt (+ optional a.json),
    sub-folders included, in sorted order; or
  - a CSV/TSV/Parquet table with an image column (a path relative to the table, or the
    image bytes) and a caption column, in row order.
The same input always gives byte-identical shards. Each shard is written to a temporary
file and renamed into place when complete. Images without a caption are skipped and listed.
"""

_WRITE_EPILOG = """\
examples:
  shardstream write photos/ -o 'shards/shard-%06d.tar'
  shardstream write photos/ -o 'shards/{shard:06d}.tar' --max-count 5000 --max-size 500MB \\
      --resize 512
  shardstream write captions.csv -o 'shards/shard-%06d.tar' --image-col path --caption-col text
  shardstream write meta.parquet -o 'out/%05d.tar' --key-col id --json-cols url,width,height

exit status: 0 shards written, 2 bad usage, unreadable source or no samples
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardstream",
        formatter_class=_Formatter,
        description="Validate, index, inspect and write WebDataset shards (paths, http(s)://, s3://).",
        epilog=_MAIN_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"shardstream {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name: str, summary: str, description: str, epilog: str) -> argparse.ArgumentParser:
        return verbs.add_parser(
            name, help=summary, description=description, epilog=epilog, formatter_class=_Formatter
        )

    url_help = "shards: paths, http(s)://, s3://, brace ranges {000000..000099}, lists joined by ::"

    p = verb(
        "validate",
        "check every shard and sample, report invalid ones",
        _VALIDATE_DESCRIPTION,
        _VALIDATE_EPILOG,
    )
    p.add_argument("urls", nargs="+", metavar="URL", help=url_help)
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
    _add_scan_options(p)

    p = verb("index", "write the dataset index (exact epochs)", _INDEX_DESCRIPTION, _INDEX_EPILOG)
    p.add_argument("urls", nargs="*", metavar="URL", help=url_help)
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
        help="scan every shard, ignoring the folder index already at -o (by default its shards whose "
        "content identity is unchanged are reused; rebuild after changing what a valid sample is)",
    )
    p.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="ignore RANK/WORLD_SIZE and index every shard in this process",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "--from-img2dataset-stats",
        action="store_true",
        help="read sample counts from img2dataset's NNNNN_stats.json next to each shard "
        "instead of scanning (no offsets, nothing validated ahead)",
    )
    _add_scan_options(p)

    p = verb(
        "subset",
        "an index of the samples matching keys, uids or a filter",
        _SUBSET_DESCRIPTION,
        _SUBSET_EPILOG,
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

    p = verb(
        "inspect",
        "show the first samples: members, sizes, images, captions",
        _INSPECT_DESCRIPTION,
        _INSPECT_EPILOG,
    )
    p.add_argument("url", metavar="URL", help="a shard (a spec of several is read in order)")
    p.add_argument(
        "-n", "--count", type=positive_int, default=5, metavar="N", help="samples shown (default: 5)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per sample")
    _add_limit(
        p,
        "--width",
        parse=positive_int,
        default=100,
        metavar="N",
        what="text members longer than this are cut",
    )

    p = verb("write", "build shards from a folder or a CSV/Parquet table", _WRITE_DESCRIPTION, _WRITE_EPILOG)
    p.add_argument("source", metavar="SOURCE", help="a folder, or a .csv/.tsv/.parquet table")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATTERN",
        help="shard path with %%06d or {shard:06d} for the shard number",
    )
    _add_limit(
        p, "--max-count", parse=positive_int, default=10000, metavar="N", what="samples per shard at most"
    )
    _add_limit(
        p,
        "--max-size",
        parse=parse_size,
        default=1 << 30,
        metavar="SIZE",
        what="bytes per shard at most, e.g. 500MB",
    )
    p.add_argument(
        "--resize",
        type=positive_int,
        default=None,
        metavar="N",
        help="re-encode as JPEG with the shorter side N px (smaller images are kept as they are)",
    )
    _add_limit(p, "--quality", parse=positive_int, default=95, metavar="Q", what="JPEG quality with --resize")
    p.add_argument("--caption-ext", default="txt", metavar="EXT", help="caption extension (default: txt)")
    p.add_argument(
        "--no-require-caption",
        dest="require_caption",
        action="store_false",
        help="write images that have no caption instead of skipping them",
    )
    t = p.add_argument_group("table sources")
    t.add_argument("--image-col", default="image", metavar="COL", help="image column (default: image)")
    t.add_argument(
        "--caption-col", default="caption", metavar="COL", help="caption column (default: caption)"
    )
    t.add_argument("--key-col", default=None, metavar="COL", help="key column (default: the row number)")
    t.add_argument(
        "--json-cols",
        type=lambda s: [c.strip() for c in s.split(",") if c.strip()],
        default=[],
        metavar="COL,...",
        help="columns stored in a .json member",
    )
    t.add_argument(
        "--base-dir",
        default=None,
        metavar="DIR",
        help="folder that image paths are relative to (default: the table's folder)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="images resized at once (default: one per core)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


# -- verbs ----------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from .cli_gather import RankGroup, share
    from .validation import default_threads

    start = time.perf_counter()
    options = _scan_options(args)
    shards = expand_specs(args.urls)
    rank, world = torchrun_rank_world() if args.distributed else (0, 1)
    threads = args.threads or default_threads(shards)
    if world == 1:
        results, elapsed = _scan_with_progress("validate", shards, options, threads, quiet=args.quiet)
        return _finish_validate(args, options, results, elapsed)

    mine = share(shards, rank, world)
    with RankGroup(rank, world) as group:
        local, _ = _scan_with_progress(
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


def _scan_with_progress(
    verb: str,
    shards: Sequence[Shard],
    options: ScanOptions,
    threads: int,
    *,
    quiet: bool,
    keep_offsets: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    from .validation import timed_scan

    with Progress(verb, total=len(shards), enabled=False if quiet else None) as progress:

        def on_result(result: dict[str, Any]) -> None:
            progress.advance(samples=result["samples"], nbytes=result["bytes"])

        # The CLI reports every unreadable shard (exit status 2) rather than stopping at the first.
        return timed_scan(
            shards,
            options,
            threads=threads,
            on_unreadable="record",
            on_result=on_result,
            keep_offsets=keep_offsets,
        )


def _finish_validate(
    args: argparse.Namespace,
    options: ScanOptions,
    results: list[dict[str, Any]],
    elapsed: float,
    *,
    world: int = 1,
) -> int:
    from .validation import build_report, format_summary

    report = build_report(results, options, elapsed=elapsed, version=package_version())
    if world > 1:
        report["world_size"] = world
    if args.json:
        atomic_write_json(args.json, report)
    summary = format_summary(report, worst=args.worst, show=args.show)
    print(summary.splitlines()[-1] if args.quiet else summary)
    return int(report["exit_status"])


def cmd_subset(args: argparse.Namespace) -> int:
    """Writes the subset of an index that keeps the samples matching --keys, --uids and
    --filter; under torchrun each rank reads the metadata of its share of the shards."""
    from .cli_gather import RankGroup, SoloGroup, share
    from .index import is_json_index_path, load_index, write_index
    from .subset import Selector, SubsetReport, check_selected, select
    from .urls import index_source_config

    start = time.perf_counter()
    if args.keys is None and args.uids is None and args.filter is None:
        raise UsageError("give --keys, --uids or --filter (or several: a sample must match all)")
    if is_json_index_path(args.output):
        raise UsageError("-o: a subset is written as a folder index (manifest + detail), not JSON")
    selector = Selector.make(keys=args.keys, uids=args.uids, filter=args.filter, metadata=args.metadata)
    index = load_index(args.index)
    config = index_source_config(None, {}, schemes=index.schemes())
    rank, world = torchrun_rank_world() if args.distributed else (0, 1)
    with SoloGroup() if world == 1 else RankGroup(rank, world) as group:
        mine = [i for _, i in share(list(range(len(index))), rank, world)]
        kept, report = select(index, selector, shards=mine, threads=args.threads, config=config)
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


def cmd_index(args: argparse.Namespace) -> int:
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
    from .cli_gather import RankGroup, SoloGroup, share
    from .errors import ShardError
    from .identity import UNKNOWN, ShardIdentity
    from .index import existing_index, plan_update
    from .validation import default_threads

    start = time.perf_counter()
    options = _scan_options(args)
    rank, world = torchrun_rank_world() if args.distributed else (0, 1)
    threads = args.threads or default_threads(shards)
    quiet = args.quiet or rank != 0
    urls = [s.display for s in shards]
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
        local, _ = _scan_with_progress(
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
    from .identity import probe_identities

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
    from .index import assemble_update, with_identities, write_index
    from .validation import is_unreadable

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
    with_identities(results, [identities[i] for i in plan.scan])
    try:
        index = assemble_update(plan, old, urls, results)
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


def _index_from_stats(args: argparse.Namespace, shards: list[Shard]) -> int:
    from .errors import ShardError
    from .index import index_from_img2dataset, write_index

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
    from .cli_gather import RankGroup
    from .errors import ShardError

    rank, world = torchrun_rank_world() if args.distributed else (0, 1)
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
    from .errors import ShardError
    from .index import load_index, write_index

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


_TEXT_EXTS = {"txt", "text", "caption", "json", "cls", "cls2", "id", "index", "label", "html"}
_IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm"}


def describe_member(ext: str, data: bytes, width: int) -> dict[str, Any]:
    """Size plus, for images, format and dimensions from the header; for text, the (cut) text."""
    info: dict[str, Any] = {"ext": ext, "bytes": len(data)}
    if ext in _IMAGE_EXTS or ext.rsplit(".", 1)[-1] in _IMAGE_EXTS:
        from . import _core

        try:
            fmt, w, h = _core.probe_image(data)
            info.update(format=fmt, width=w, height=h)
        except Exception as e:  # noqa: BLE001 - any probe failure is shown, not raised
            info["error"] = str(e)
    elif ext in _TEXT_EXTS or (len(data) <= 4096 and b"\0" not in data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            info["error"] = f"not UTF-8: {e}"
        else:
            info["text"] = text if len(text) <= width else text[: width - 3] + "..."
    return info


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import read_samples
    from .errors import ShardError

    shown = 0
    try:
        for sample in read_samples(args.url, on_error="raise"):
            members = [
                describe_member(ext, value, args.width)
                for ext, value in sample.items()
                if not ext.startswith("__")
            ]
            if args.json:
                print(
                    json.dumps(
                        {"key": sample["__key__"], "url": sample.get("__url__", ""), "members": members},
                        ensure_ascii=False,
                    )
                )
            else:
                _print_sample(shown, sample, members)
            shown += 1
            if shown >= args.count:
                break
    except ShardError as e:
        print_err("inspect", str(e))
        return EXIT_USAGE if shown == 0 and _looks_unreadable(e) else EXIT_INVALID
    if shown == 0:
        print_err("inspect", "no samples")
        return EXIT_INVALID
    return EXIT_OK


def _looks_unreadable(error: Exception) -> bool:
    return getattr(error, "reason", "unreadable") == "unreadable"


def _print_sample(number: int, sample: dict[str, Any], members: list[dict[str, Any]]) -> None:
    print(f"#{number} key {sample['__key__']!r}  ({sample.get('__url__', '')})")
    for m in members:
        detail = ""
        if "format" in m:
            detail = f"{m['format']} {m['width']}x{m['height']}"
        elif "text" in m:
            detail = json.dumps(m["text"], ensure_ascii=False)
        if "error" in m:
            detail = f"ERROR {m['error']}"
        print(f"  {m['ext']:<8} {m['bytes']:>10,} B  {detail}")


def cmd_write(args: argparse.Namespace) -> int:
    from .writer import write_from_folder, write_from_table

    if not os.path.exists(args.source):
        raise UsageError(f"source not found: {args.source}")
    common = dict(
        max_count=args.max_count,
        max_size=args.max_size,
        resize=args.resize,
        quality=args.quality,
        caption_ext=args.caption_ext,
        require_caption=args.require_caption,
        threads=args.threads,
    )
    with Progress("write", unit="samples", enabled=False if args.quiet else None) as progress:

        def on_sample(_: int) -> None:
            progress.advance()

        if os.path.isdir(args.source):
            table_only = [
                flag
                for flag, value in (
                    ("--key-col", args.key_col),
                    ("--json-cols", args.json_cols),
                    ("--base-dir", args.base_dir),
                )
                if value
            ]
            if table_only:
                raise UsageError(f"{', '.join(table_only)} only apply to a table source, not a folder")
            result = write_from_folder(args.source, args.output, on_sample=on_sample, **common)
        else:
            result = write_from_table(
                args.source,
                args.output,
                image_col=args.image_col,
                caption_col=args.caption_col,
                key_col=args.key_col,
                json_cols=args.json_cols,
                base_dir=args.base_dir,
                on_sample=on_sample,
                **common,
            )
    if not args.quiet:
        where = (
            f": {result.shards[0]} .. {result.shards[-1]}"
            if len(result.shards) > 1
            else (f": {result.shards[0]}" if result.shards else "")
        )
        print(
            f"wrote {result.samples:,} samples in {len(result.shards):,} shards, "
            f"{human_bytes(result.bytes)}{where}"
        )
    if result.skipped:
        print(f"skipped {len(result.skipped):,} inputs:", file=sys.stderr)
        for name, why in result.skipped[:20]:
            print(f"  {name}: {why}", file=sys.stderr)
        if len(result.skipped) > 20:
            print(f"  ... and {len(result.skipped) - 20:,} more", file=sys.stderr)
    if result.samples == 0:
        print_err("write", f"no samples found in {args.source}")
        return EXIT_USAGE
    return EXIT_OK


_VERBS = {
    "validate": cmd_validate,
    "index": cmd_index,
    "subset": cmd_subset,
    "inspect": cmd_inspect,
    "write": cmd_write,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) and usage errors (2) from argparse
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    from .errors import ShardError

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
