"""The interleaved kind (``count_interleaved`` + ``InterleavedLoader``) over remote sources: each of
its four source layouts -- OBELICS Parquet, MINT-1T tars, LLaVA conversation tars
(``layout=Conversations()``) and image-caption pair tars (``layout=Captions()``) -- pushed to a local
Hugging Face Hub (``hf://``, tests/hub_server.py) and uploaded to SeaweedFS (``s3://``, signatures
checked) counts to the same units, pinned to their bytes, and loads on rank 1 of 2 into exactly the
batches of the local files (keys, ids, labels, positions, pixels, grids, sequence bounds)."""

from __future__ import annotations

import hashlib
import os
import pathlib
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from conversation_corpus import real_conversations, write_llava_tar  # noqa: E402
from hub_server import LocalHub  # noqa: E402
from interleaved_corpus import (  # noqa: E402
    real_documents,
    write_caption_tar,
    write_mint_tar,
    write_obelics_parquet,
)
from qwen_reference import EOS, write_chat_tokenizer_json, write_tokenizer_json  # noqa: E402
from shardstream import (  # noqa: E402
    Captions,
    Conversations,
    InterleavedCounts,
    InterleavedLoader,
    QwenVL,
    SourceOptions,
    count_interleaved,
)

SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
SEQ_LEN, BATCH = 1024, 2
PAD = 2  # "<pad>" in the fixture tokenizer
FILES = 3
REPO = "acme/interleaved-mini"
TOKEN = "hf_interleaved_remote_token_0123"
BUCKET = "interleaved"
LAYOUTS = ("obelics", "mint", "llava", "captions")


@dataclass
class Corpus:
    """One layout's local files and what they count and load to on rank 1 of 2."""

    files: list[str]
    suffix: str
    tokenizer: str
    layout: Any
    counts: InterleavedCounts
    batches: list[tuple[list[str], str]]


def count(files, tokenizer: str, layout: Any = None, **kw) -> InterleavedCounts:
    if layout is not None:
        kw["layout"] = layout
    settings = {"spec": SPEC, "seq_len": SEQ_LEN, "batch_size": BATCH, "eos_token": EOS, "threads": 2, **kw}
    return count_interleaved(files, tokenizer=tokenizer, **settings)


def batch_digest(b) -> str:
    h = hashlib.sha256()
    for t in (b.input_ids, b.labels, b.position_ids, b.pixel_values, b.image_grid_thw, b.cu_seqlens):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def rank1_batches(counts: InterleavedCounts, **kw) -> list[tuple[list[str], str]]:
    """Rank 1 of 2's batches: their keys and a digest of every tensor."""
    loader = InterleavedLoader(counts, pad_token_id=PAD, rank=1, world_size=2, threads=2, **kw)
    return [(list(b.keys), batch_digest(b)) for b in loader]


def sha256_of(path: str) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def md5_of(path: str) -> str:
    return hashlib.md5(pathlib.Path(path).read_bytes()).hexdigest()


def strip(c: InterleavedCounts) -> list[tuple]:
    fields = (
        "first_row",
        "rows",
        "documents",
        "batches",
        "text_tokens",
        "image_tokens",
        "patches",
        "skipped",
    )
    return [tuple(u[f] for f in fields) for u in c.units]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Corpus]:
    root = tmp_path_factory.mktemp("interleaved-remote")
    plain = write_tokenizer_json(str(root / "tokenizer.json"))
    chat = write_chat_tokenizer_json(str(root / "chat-tokenizer.json"))
    docs = real_documents(4 * FILES, seed=11)
    convs = real_conversations(3 * FILES, seed=11)
    built: dict[str, tuple[list[str], str, str, Any]] = {}
    for name in LAYOUTS:
        os.makedirs(root / name)
    built["obelics"] = (
        [
            write_obelics_parquet(str(root / "obelics" / f"part-{i}.parquet"), docs[i::FILES], 2)
            for i in range(FILES)
        ],
        "parquet",
        plain,
        None,
    )
    built["mint"] = (
        [write_mint_tar(str(root / "mint" / f"mint-{i}.tar"), docs[i::FILES]) for i in range(FILES)],
        "tar",
        plain,
        None,
    )
    built["llava"] = (
        [write_llava_tar(str(root / "llava" / f"llava-{i}.tar"), convs[i::FILES]) for i in range(FILES)],
        "tar",
        chat,
        Conversations(),
    )
    built["captions"] = (
        [write_caption_tar(str(root / "captions" / f"pairs-{i}.tar"), 12, seed=i) for i in range(FILES)],
        "tar",
        plain,
        Captions(),
    )
    out = {}
    for name, (files, suffix, tokenizer, layout) in built.items():
        counts = count(files, tokenizer, layout)
        assert counts.failed == [] and all(u["skipped"] == {} for u in counts.units), name
        assert len(counts.units) == FILES and counts.documents > 0, name
        batches = rank1_batches(counts)
        assert batches, f"{name}: rank 1 of 2 has no batches, the comparison would hold vacuously"
        out[name] = Corpus(files, suffix, tokenizer, layout, counts, batches)
    return out


@pytest.fixture(scope="module")
def hub(corpora):
    """One local Hub for the module, holding every layout's files under ``{layout}/``."""
    with LocalHub(token=TOKEN) as server:
        files = {
            f"{name}/{os.path.basename(p)}": pathlib.Path(p).read_bytes()
            for name, c in corpora.items()
            for p in c.files
        }
        server.push(REPO, {**files, "README.md": b"# interleaved\n"})
        yield server


@pytest.fixture()
def hub_env(hub, monkeypatch, tmp_path):
    """As tests/test_text_sources.py: no token file of the user's leaks in (HF_HOME), the Hub is
    the local one (HF_ENDPOINT), and the token is HF_TOKEN."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return hub


@pytest.fixture(scope="module")
def s3_corpora(s3, corpora):
    """The module's SeaweedFS server holding every layout's files under ``{layout}/``."""
    for name, c in corpora.items():
        s3.upload(BUCKET, c.files, prefix=f"{name}/")
    return s3


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_on_the_hub_reads_as_the_local_files(name, corpora, hub_env):
    """Pushed to the Hub and named by an ``hf://`` glob, the layout's files count to the local
    files' units (same order, first rows, documents, batches, tokens and patches), each named at
    the commit it was listed at and pinned to its bytes; rank 1 of 2 then loads exactly the local
    files' batches. The resolve calls carry HF_TOKEN as a bearer token; every byte comes from the
    storage host behind the resolve redirect, which never sees the token."""
    corpus, hub = corpora[name], hub_env
    sha = hub.repos[REPO].branches["main"]
    before, api_before = len(hub.storage_requests), len(hub.requests)
    remote = count(f"hf://datasets/{REPO}/{name}/*.{corpus.suffix}", corpus.tokenizer, corpus.layout)
    assert [u["display"] for u in remote.units] == [
        f"hf://datasets/{REPO}@{sha}/{name}/{os.path.basename(p)}" for p in corpus.files
    ]
    assert remote.failed == [] and strip(remote) == strip(corpus.counts)
    # Pinned to the bytes the storage host served: its ETag (the blob's sha256 on this Hub).
    assert [u["identity"] for u in remote.units] == [f'etag:"{sha256_of(p)}"' for p in corpus.files]
    assert rank1_batches(remote) == corpus.batches
    reads = hub.storage_requests[before:]
    assert reads and all(r.path.startswith("/blobs/") for r in reads)
    assert all("authorization" not in r.headers for r in reads)
    resolves = [r for r in hub.requests[api_before:] if "/resolve/" in r.path]
    assert resolves and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in resolves)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_on_s3_reads_as_the_local_files(name, corpora, s3_corpora, monkeypatch, hermetic_aws_env):
    """Uploaded to SeaweedFS and named by an ``s3://`` glob (requests signed with the server's
    keys), the layout's files count to the local files' units, each pinned by its ETag; rank 1
    of 2 then loads exactly the local files' batches."""
    corpus, server = corpora[name], s3_corpora
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    source = SourceOptions(**server.s3_options())
    remote = count(f"s3://{BUCKET}/{name}/*.{corpus.suffix}", corpus.tokenizer, corpus.layout, source=source)
    assert [u["display"] for u in remote.units] == [
        f"s3://{BUCKET}/{name}/{os.path.basename(p)}" for p in corpus.files
    ]
    assert remote.failed == [] and strip(remote) == strip(corpus.counts)
    # Pinned by ETag: a single-part upload's is the object's MD5.
    assert [u["identity"] for u in remote.units] == [f'etag:"{md5_of(p)}"' for p in corpus.files]
    assert rank1_batches(remote, source=source) == corpus.batches
