"""``shardstream inspect``: the first samples of a shard, their members and sizes, image
formats and dimensions from the header, and the text of text members."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, add_limit, add_verb, positive_int, print_err

_DESCRIPTION = """\
Show the first samples: key, members and their sizes, image format and dimensions (read
from the header) and the text of text members.
"""

_EPILOG = """\
examples:
  shardstream inspect shards/shard-000000.tar
  shardstream inspect https://host/data/shard-000000.tar -n 3 --json

exit status: 0 samples shown, 1 the shard is corrupt, 2 unreadable or bad usage
"""


def add_parser(verbs: argparse._SubParsersAction) -> None:
    p = add_verb(
        verbs,
        "inspect",
        "show the first samples: members, sizes, images, captions",
        _DESCRIPTION,
        _EPILOG,
    )
    p.add_argument("url", metavar="URL", help="a shard (a spec of several is read in order)")
    p.add_argument(
        "-n", "--count", type=positive_int, default=5, metavar="N", help="samples shown (default: 5)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per sample")
    add_limit(
        p,
        "--width",
        parse=positive_int,
        default=100,
        metavar="N",
        what="text members longer than this are cut",
    )


_TEXT_EXTS = {"txt", "text", "caption", "json", "cls", "cls2", "id", "index", "label", "html"}
_IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm"}


def describe_member(ext: str, data: bytes, width: int) -> dict[str, Any]:
    """Size plus, for images, format and dimensions from the header; for text, the (cut) text.
    A member named neither (a Parquet column such as ``datasets``' ``image``) is an image when
    its header reads as one."""
    from .. import _core

    info: dict[str, Any] = {"ext": ext, "bytes": len(data)}
    if ext in _IMAGE_EXTS or ext.rsplit(".", 1)[-1] in _IMAGE_EXTS:
        try:
            fmt, w, h = _core.probe_image(data)
            info.update(format=fmt, width=w, height=h)
        except Exception as e:  # noqa: BLE001 - any probe failure is shown, not raised
            info["error"] = str(e)
        return info
    if ext not in _TEXT_EXTS:
        try:
            fmt, w, h = _core.probe_image(data)
        except Exception:  # noqa: BLE001 - not an image: described as text or bytes below
            pass
        else:
            info.update(format=fmt, width=w, height=h)
            return info
    if ext in _TEXT_EXTS or (len(data) <= 4096 and b"\0" not in data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            info["error"] = f"not UTF-8: {e}"
        else:
            info["text"] = text if len(text) <= width else text[: width - 3] + "..."
    return info


def cmd_inspect(args: argparse.Namespace) -> int:
    from .. import read_samples
    from ..errors import ShardError

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
