"""``shardstream write``: shards built from a folder of images with captions or from a
CSV/TSV/Parquet table."""

from __future__ import annotations

import argparse
import os
import sys

from ..progress import Progress, human_bytes
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_limit,
    add_verb,
    parse_size,
    positive_int,
    print_err,
)

_DESCRIPTION = """\
Build shards from
  - a folder of images with captions of the same name: a.jpg + a.txt (+ optional a.json),
    sub-folders included, in sorted order; or
  - a CSV/TSV/Parquet table with an image column (a path relative to the table, or the
    image bytes) and a caption column, in row order.
The same input always gives byte-identical shards. Each shard is written to a temporary
file and renamed into place when complete. Images without a caption are skipped and listed.
"""

_EPILOG = """\
examples:
  shardstream write photos/ -o 'shards/shard-%06d.tar'
  shardstream write photos/ -o 'shards/{shard:06d}.tar' --max-count 5000 --max-size 500MB \\
      --resize 512
  shardstream write captions.csv -o 'shards/shard-%06d.tar' --image-col path --caption-col text
  shardstream write meta.parquet -o 'out/%05d.tar' --key-col id --json-cols url,width,height

exit status: 0 shards written, 2 bad usage, unreadable source or no samples
"""


def add_parser(verbs: argparse._SubParsersAction) -> None:
    p = add_verb(verbs, "write", "build shards from a folder or a CSV/Parquet table", _DESCRIPTION, _EPILOG)
    p.add_argument("source", metavar="SOURCE", help="a folder, or a .csv/.tsv/.parquet table")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATTERN",
        help="shard path with %%06d or {shard:06d} for the shard number",
    )
    add_limit(
        p, "--max-count", parse=positive_int, default=10000, metavar="N", what="samples per shard at most"
    )
    add_limit(
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
    add_limit(p, "--quality", parse=positive_int, default=95, metavar="Q", what="JPEG quality with --resize")
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


def cmd_write(args: argparse.Namespace) -> int:
    from ..writer import write_from_folder, write_from_table

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
