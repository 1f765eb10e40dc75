"""Parquet over S3 (SeaweedFS, signatures checked): the footer and each row group's column chunks
fetched by range through presigned URLs read the same samples as the local files."""

from __future__ import annotations

import os

import pytest
import shardstream
from parquet_corpus import write_pairs
from servers import SeaweedS3
from shardstream.index import build_index, write_index

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET = "parquet-shards"
FAST = {"connect_timeout": 2.0, "read_timeout": 2.0, "max_retries": 4}
HF = {"caption_key": "text", "image_keys": ["image"]}


@pytest.fixture(autouse=True)
def _no_machine_aws(hermetic_aws_env: None) -> None:
    """Every test of this module runs without the machine's AWS settings (conftest.py)."""


def by_key(loader) -> dict[str, tuple[bytes, str]]:
    return {k: (b.images[i].numpy().tobytes(), b.texts[i]) for b in loader for i, k in enumerate(b.keys)}


def test_parquet_over_s3_reads_the_same_samples_as_local(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("pq-s3")
    parquets, _, keys = write_pairs(str(d / "data"), [9, 6], seed=21, layout="hf", rows_per_group=3)
    for p in parquets:
        os.remove(p.replace(".parquet", ".tar"))
    with SeaweedS3(str(tmp_path_factory.mktemp("seaweed"))) as server:
        server.upload_dir(BUCKET, str(d / "data"), prefix="hf/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        spec = f"s3://{BUCKET}/hf/*.parquet"
        remote = [dict(s) for s in shardstream.read_samples(spec, source=server.source(), **FAST)]
        local = [dict(s) for s in shardstream.read_samples(parquets)]
        strip = lambda rows: [{k: v for k, v in r.items() if k != "__url__"} for r in rows]  # noqa: E731
        assert strip(remote) == strip(local)
        index = write_index(
            build_index(spec, decode=False, source_options=server.s3_options(), **HF), str(d / "index")
        )
        loader = shardstream.ShardLoader(
            spec, index=index, batch_size=4, image_size=32, drop_last=False, threads=1, **HF, **FAST
        )
        got = by_key(loader)
        assert sorted(got) == sorted(keys)
        assert got == by_key(
            shardstream.ShardLoader(parquets, batch_size=4, image_size=32, drop_last=False, threads=1, **HF)
        )
