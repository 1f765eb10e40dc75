"""Checks that the HTTP and S3 source tests share: samples compared without where they were
read from, and retries that resume where the last attempt stopped."""

from __future__ import annotations


def comparable(samples) -> list[dict]:
    """Samples without ``__url__`` (it names where they came from, which is the point to vary)."""
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


def check_resumes(requests) -> None:
    """Every retry continues at the first byte not yet delivered (exactly the cut for clean closes
    and stalls; at most the cut for a reset, as the kernel may drop bytes in flight when the RST
    arrives; the same offset after an error status), pinned with If-Match to the version first seen."""
    offset_of = [int(r.range[len("bytes=") : -1]) if r.range else 0 for r in requests]
    assert offset_of[0] == 0
    version_seen = False
    for i, (before, after) in enumerate(zip(requests, requests[1:], strict=False)):
        kind = (before.fault or "").split(" ")[0]
        cut = (
            offset_of[i] + int(before.fault.rsplit(" ", 1)[1])
            if kind in ("short", "stall", "reset")
            else None
        )
        if kind in ("short", "stall"):
            assert offset_of[i + 1] == cut
        elif kind == "reset":
            assert offset_of[i] <= offset_of[i + 1] <= cut
        else:
            assert offset_of[i + 1] == offset_of[i]
        version_seen = version_seen or kind != "status"
        assert (after.if_match is not None) == version_seen
        if after.range is not None:
            assert after.range.endswith("-")
