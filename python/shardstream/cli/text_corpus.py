"""``shardstream index --tokenizer`` and ``shardstream validate --tokenizer``: a text corpus
(Parquet string column, JSONL files, tar text members, a JSON field) read and encoded as the packed text kind
reads it. ``index`` writes its token counts (what :class:`shardstream.TextLoader` plans epochs
with); ``validate`` reports the documents it cannot use, with typed reasons."""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections import Counter
from typing import Any

from .._files import atomic_write_json
from .._system import launch_rank_world
from .common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, print_err


def add_text_options(p: argparse.ArgumentParser) -> None:
    """The options that make the verb read a text corpus (the packed text kind)."""
    g = p.add_argument_group(
        "text corpora (the packed text kind: shardstream.TextLoader)",
        "with --tokenizer the URLs are a text corpus: every document is read and encoded as "
        "TextLoader will; index writes the token counts (-o NAME.json[.gz]) instead of an index. "
        "Token counts already at -o (same tokenizer and settings) are reused for the files whose "
        "content identity is unchanged: only new or changed files are read (--rebuild reads all); "
        "under torchrun each rank counts its share of the files and rank 0 writes the counts",
    )
    g.add_argument("--tokenizer", metavar="TOKENIZER_JSON", help="a Hugging Face tokenizer.json")
    g.add_argument(
        "--text-key",
        default="text",
        metavar="KEY",
        help="a Parquet string column, a JSONL field (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz files) or "
        "tar member extension (txt, py), or json:FIELD (default: text)",
    )
    g.add_argument("--eos-token", metavar="TOKEN", help="appended to every document (default: the usual EOS)")
    g.add_argument("--bos-token", metavar="TOKEN", help="put before every document (default: none)")
    g.add_argument(
        "--max-document-bytes",
        type=int,
        default=None,
        metavar="N",
        help="skip (and count) larger documents, for JSONL longer lines (default: 64 MiB)",
    )


def _counts(args: argparse.Namespace, *, previous: str | None = None, distributed: bool = False) -> Any:
    from ..errors import UnreadableUnitsWarning
    from ..kinds.text import DEFAULT_MAX_DOCUMENT_BYTES, count_tokens

    # The verbs say each failed unit themselves (`_summary`) and set the exit status by them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreadableUnitsWarning)
        return count_tokens(
            list(args.urls),
            tokenizer=args.tokenizer,
            text_key=args.text_key,
            eos_token=args.eos_token,
            bos_token=args.bos_token,
            max_document_bytes=args.max_document_bytes or DEFAULT_MAX_DOCUMENT_BYTES,
            threads=args.threads,
            previous=previous,
            distributed=distributed,
        )


def _summary(verb: str, counts: Any, elapsed: float) -> list[str]:
    lines = [
        f"{verb}: {len(counts.units)} units, {counts.documents:,} documents, "
        f"{counts.total_tokens:,} tokens in {elapsed:.1f} s"
    ]
    skipped = counts.skipped
    if skipped:
        lines.append(
            f"{verb}: documents skipped: " + ", ".join(f"{r} {n}" for r, n in sorted(skipped.items()))
        )
    for f in counts.failed:
        lines.append(f"{verb}: cannot read {f['display']}: {f['error']['reason']}: {f['error']['detail']}")
    return lines


def cmd_index(args: argparse.Namespace) -> int:
    """Writes the corpus's token counts to -o; exit 2 (nothing written) when a unit cannot be
    read or no document encodes to a token."""
    if not args.urls:
        print_err("index", "give the text files to count (URL...)")
        return EXIT_USAGE
    if not args.output.endswith((".json", ".json.gz")):
        print_err("index", f"-o {args.output}: token counts are one file, NAME.json or NAME.json.gz")
        return EXIT_USAGE
    rank = launch_rank_world()[0] if args.distributed else 0
    # Counts already at -o are what a grown corpus is counted against (rank 0 reads them).
    previous = args.output if not args.rebuild and os.path.exists(args.output) else None
    start = time.perf_counter()
    try:
        counts = _counts(args, previous=previous, distributed=args.distributed)
    except ValueError as e:
        print_err("index", str(e))
        return EXIT_USAGE
    if rank != 0:  # every rank holds the same counts; rank 0 reports and writes them
        return EXIT_USAGE if counts.failed else EXIT_OK
    lines = _summary("index", counts, time.perf_counter() - start)
    if counts.failed:
        for line in lines[1:]:
            print_err("index", line.removeprefix("index: "))
        print_err("index", f"{len(counts.failed)} units could not be read: no token counts written")
        return EXIT_USAGE
    counts.save(args.output)
    if not args.quiet:
        print("\n".join(lines))
        print(f"index: token counts written to {args.output}")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """Reports every document the packed text kind cannot use; exit 1 when there is one."""
    start = time.perf_counter()
    try:
        counts = _counts(args)
        failed = None
    except ValueError as e:
        counts, failed = None, str(e)
    if counts is None:
        print_err("validate", failed or "")
        return EXIT_INVALID
    lines = _summary("validate", counts, time.perf_counter() - start)
    invalid = sum(counts.skipped.values()) + len(counts.failed)
    if args.json:
        report: dict[str, Any] = {
            "kind": "text",
            "units": len(counts.units),
            "documents": counts.documents,
            "tokens": counts.total_tokens,
            "skipped": counts.skipped,
            "examples": [e for u in counts.units for e in u.get("examples", [])],
            "failed": counts.failed,
            "exit_status": EXIT_INVALID if invalid else EXIT_OK,
        }
        atomic_write_json(args.json, report)
    print(lines[-1] if args.quiet else "\n".join(lines))
    reasons = Counter(counts.skipped)
    if invalid:
        top = ", ".join(f"{r} {n}" for r, n in reasons.most_common(3))
        print(f"validate: {invalid} invalid ({top or 'unreadable units'})")
        return EXIT_INVALID
    print("validate: all documents valid")
    return EXIT_OK
