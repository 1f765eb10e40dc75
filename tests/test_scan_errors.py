"""A scan that raises on an unreadable shard raises the class the source failure's kind maps to
(``shardstream.errors``' one table), as the loader does: the kind travels from the core's scan,
never read off the message."""

from __future__ import annotations

import pytest
from corpus import good_shard
from shardstream.errors import NotFoundError
from shardstream.index import build_index
from shardstream.urls import Shard
from shardstream.validation import ScanOptions, build_report, scan_shards


def test_build_index_raises_not_found_for_a_missing_local_shard(tmp_path):
    good = good_shard(str(tmp_path / "good-000000.tar"))
    missing = str(tmp_path / "gone-000001.tar")
    with pytest.raises(NotFoundError) as raised:
        build_index([good, missing])
    assert raised.value.url == missing
    assert raised.value.reason == "unreadable"
    assert "gone-000001.tar" in str(raised.value)
    # Raised by the scan (which read the good shard first), not by a check before it.
    assert "1 of 2 shards unreadable" in str(raised.value)


def test_a_recorded_unreadable_shard_carries_its_kind_but_the_report_keeps_its_format(tmp_path):
    missing = str(tmp_path / "gone-000000.tar")
    [result] = scan_shards([Shard(missing)], ScanOptions(), on_unreadable="record")
    assert result["fatal"]["reason"] == "unreadable"
    assert result["fatal"]["kind"] == "not_found"
    report = build_report([result], ScanOptions())
    assert set(report["shards"][0]["fatal"]) == {"reason", "detail"}
    assert set(report["shard_errors"][0]) == {"shard", "reason", "detail"}
