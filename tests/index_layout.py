"""An independent reader of the version-2 index layout, written from docs/epoch-plan.md alone
(not from the Rust code): tests read what `shardstream index` wrote with it, so the format stays
what the documentation says. It returns the version-1 JSON shape: {"shards": [{"url", ...}]}."""

from __future__ import annotations

import gzip
import io
import json
import os
from typing import Any

REASON_FIELDS = ("ordinal", "reason", "key", "detail")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    def byte(self) -> int:
        return self.buf.read(1)[0]

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7

    def string(self) -> str:
        return self.buf.read(self.varint()).decode()


def read_detail_block(block: bytes, num_samples: int) -> dict[str, Any]:
    r = _Reader(gzip.decompress(block))
    assert r.buf.read(4) == b"SSD2"
    assert r.varint() == num_samples
    r.buf.read(8)  # the shard name's hash
    flags = r.byte()
    out: dict[str, Any] = {}
    if flags & 1:
        unit, total, offsets = r.varint(), 0, []
        for _ in range(num_samples + 1):
            total += r.varint() * unit
            offsets.append(total)
        out["offsets"] = offsets
    if flags & 2:
        out["keys"] = [r.string() for _ in range(num_samples)]
    if flags & 4:
        invalid = []
        for _ in range(r.varint()):
            ordinal = r.varint()
            invalid.append(
                {"ordinal": ordinal, "reason": r.string(), "key": r.string(), "detail": r.string()}
            )
        out["invalid"] = invalid
    r.buf.read(8)  # checksum
    assert r.buf.read() == b""
    return out


def read_layout(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, "manifest.bin"), "rb") as f:
        data = f.read()
    assert data[:8] == b"SSINDEX2", data[:8]
    r = _Reader(gzip.decompress(data[8:]))
    header = json.loads(r.buf.read(r.varint()))
    shards = []
    for _ in range(header["num_shards"]):
        entry: dict[str, Any] = {"url": r.string()}
        size = r.varint()
        if size:
            entry["size"] = size - 1
        entry["num_samples"] = r.varint()
        flags = r.byte()
        entry["compressed"] = bool(flags & 1)
        identity = r.string()
        if identity:
            entry["identity"] = identity
        detail: dict[str, Any] = {}
        if flags & 2:
            file, offset, length = r.varint(), r.varint(), r.varint()
            with open(os.path.join(folder, header["detail_files"][file]), "rb") as f:
                f.seek(offset)
                detail = read_detail_block(f.read(length), entry["num_samples"])
        ordinals, ordinal = [], 0
        for _ in range(r.varint()):
            ordinal += r.varint()
            ordinals.append(ordinal)
        # The manifest holds the ordinals (what the plan skips); keys and reasons are detail.
        invalid = detail.pop("invalid", [])
        assert [i["ordinal"] for i in invalid] == ordinals, (invalid, ordinals)
        entry.update(detail)
        entry["invalid"] = invalid
        shards.append(entry)
    return {"format": header["format"], "version": header["version"], "shards": shards, "header": header}
