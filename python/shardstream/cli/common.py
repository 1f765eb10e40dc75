"""What the verbs share: exit statuses and the usage error, option types (sizes, counts, lists),
URL specs expanded, error lines, the scan options of validate and index, and a scan with
progress."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from .._stderr import say
from ..config import DEFAULTS
from ..progress import Progress
from ..urls import Shard
from ..validation import ScanOptions

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or inputs: printed as one line, exit status 2."""


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
    from ..errors import ShardError
    from ..urls import expand_urls

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
    say(f"shardstream {verb}: error: {message}")


URL_HELP = (
    "shards: paths, http(s)://, s3://, hf://datasets/ORG/NAME[@REV]/PATH, brace ranges {000000..000099}, "
    "lists joined by ::"
)


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def add_limit(
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


def add_scan_options(p: argparse.ArgumentParser) -> None:
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
    add_limit(
        g,
        "--max-pixels",
        parse=positive_int,
        default=DEFAULTS.max_pixels,
        metavar="N",
        what="reject images with more pixels, read from the header",
    )
    add_limit(
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
        help="shards scanned at once (default: one per core; 4 per core for remote URLs or --no-decode)",
    )


def scan_options(args: argparse.Namespace) -> ScanOptions:
    return ScanOptions(
        decode=args.decode,
        caption_key=args.caption_key,
        image_keys=tuple(args.image_keys),
        require_caption=args.require == "image,caption",
        max_pixels=args.max_pixels,
        max_member_bytes=args.max_member_bytes,
    )


def add_verb(
    verbs: argparse._SubParsersAction, name: str, summary: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """A verb's parser, formatted as every verb's help is."""
    return verbs.add_parser(
        name, help=summary, description=description, epilog=epilog, formatter_class=Formatter
    )


def scan_with_progress(
    verb: str,
    shards: Sequence[Shard],
    options: ScanOptions,
    threads: int,
    *,
    quiet: bool,
    keep_offsets: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    from ..validation import timed_scan

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
