"""Loaders made from an index or counts alone (no URL list: the form the docs teach, and the only
one that scales to a million shards) over remote shards: SeaweedFS (``s3://``, signatures checked)
and a local Hugging Face Hub (``hf://``). Each reads exactly the batches of the same loader over
local copies: the square and NaFlex kinds and an index mixture (``ShardLoader(index=...)``,
``ShardLoader(sources=[Source(index=...)])``), token-budget NaFlex from its counts, a text
mixture and a VLM mixture (interleaved documents, caption pairs, text) from saved counts files,
and an index that is itself on S3. An index-only loader over
``s3://`` shards crashed when it was made (issue 50: a source option meant for the URL expansion
was passed to the S3 client).

The text and interleaved kinds built from their counts alone over both sources are checked in
tests/test_text_sources.py and tests/test_interleaved_remote.py."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from hub_server import LocalHub
from servers import SeaweedS3, build_photo_shards
from shardstream import NaFlex, ShardLoader, Source, TextMixture, TextSource, count_tokens
from shardstream.cli import main
from shardstream.kinds.naflex_budget import NaFlexBudgetLoader, count_patches
from text_corpus import GPT2_STYLE, documents, write_parquet_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET, REPO, TOKEN = "only", "acme/index-only", "hf_index_only_token_0123"
SHARDS, PER_SHARD = 4, 10
FAST = {"connect_timeout": 2.0, "read_timeout": 2.0, "max_retries": 4}
SPEC = NaFlex(patch_size=16, max_num_patches=64)
REMOTES = ("s3", "hf")


@pytest.fixture(autouse=True)
def _no_machine_aws(hermetic_aws_env: None) -> None:
    """No AWS setting of the machine's leaks in (conftest.py)."""


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Two folders of real-photo shards ("a" and "b", the mixture's two sources)."""
    root = tmp_path_factory.mktemp("index-only")
    for part, seed in (("a", 5), ("b", 6)):
        build_photo_shards(str(root / part), shards=SHARDS, per_shard=PER_SHARD, seed=seed)
    texts = documents(20)
    for part, chosen in (("ta", texts[:300]), ("tb", texts[300:500])):
        os.makedirs(root / part)
        write_parquet_corpus(str(root / part), chosen, files=2)
    return root


def text_files(local, part: str) -> list[str]:
    return sorted(str(local / part / n) for n in os.listdir(local / part))


def names() -> list[str]:
    return [f"shard-{i:06d}.tar" for i in range(SHARDS)]


def local_spec(local, part: str) -> list[str]:
    return [str(local / part / n) for n in names()]


@pytest.fixture(scope="module")
def servers(local, tmp_path_factory):
    """SeaweedFS and the local Hub, each holding both folders."""
    files = {f"{part}/{n}": (local / part / n).read_bytes() for part in ("a", "b") for n in names()}
    with SeaweedS3(str(tmp_path_factory.mktemp("weed"))) as s3, LocalHub(token=TOKEN) as hub:
        for part in ("a", "b"):
            s3.upload(BUCKET, local_spec(local, part), prefix=f"{part}/")
        for part in ("ta", "tb"):
            s3.upload(BUCKET, text_files(local, part), prefix=f"{part}/")
            files.update(
                {f"{part}/{os.path.basename(p)}": open(p, "rb").read() for p in text_files(local, part)}
            )
        hub.push(REPO, {**files, "README.md": b"# photos\n"})
        yield {"s3": s3, "hf": hub}


@pytest.fixture()
def env(servers, monkeypatch, tmp_path):
    """The S3 server's credentials and endpoint, and the Hub's endpoint and token, as a user
    sets them; no token file of the user's (HF_HOME)."""
    for name, value in servers["s3"].env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_ENDPOINT", servers["hf"].endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return servers


def remote_spec(remote: str, part: str) -> str:
    if remote == "s3":
        return f"s3://{BUCKET}/{part}/shard-{{000000..{SHARDS - 1:06d}}}.tar"
    return f"hf://datasets/{REPO}/{part}/*.tar"


def index_of(spec, path) -> str:
    """An index made by the CLI, as users make it (``shardstream index SPEC -o PATH``)."""
    assert main(["index", *([spec] if isinstance(spec, str) else spec), "-o", str(path), "-q"]) == 0
    return str(path)


def batches(loader) -> list[tuple[list[str], str]]:
    """Each batch's keys and a digest of its pixels."""
    out = []
    for b in loader:
        pixels = b.images if hasattr(b, "images") and b.images is not None else b.pixel_values
        out.append((list(b.keys), hashlib.sha256(pixels.numpy().tobytes()).hexdigest()))
    assert out, "no batches: the comparison would hold vacuously"
    return out


def square(index: str, **kw) -> ShardLoader:
    return ShardLoader(
        index=index, batch_size=4, image_size=32, threads=1, rank=1, world_size=2, **FAST, **kw
    )


@pytest.mark.parametrize("remote", REMOTES)
def test_a_square_loader_from_the_index_alone_reads_the_local_batches(remote, local, env, tmp_path):
    reference = batches(square(index_of(local_spec(local, "a"), tmp_path / "local.index")))
    assert batches(square(index_of(remote_spec(remote, "a"), tmp_path / "remote.index"))) == reference


@pytest.mark.parametrize("remote", REMOTES)
def test_a_naflex_loader_from_the_index_alone_reads_the_local_batches(remote, local, env, tmp_path):
    def naflex(index):
        return ShardLoader(index=index, batch_size=4, sample=SPEC, threads=1, rank=1, world_size=2, **FAST)

    reference = batches(naflex(index_of(local_spec(local, "a"), tmp_path / "local.index")))
    assert batches(naflex(index_of(remote_spec(remote, "a"), tmp_path / "remote.index"))) == reference


@pytest.mark.parametrize("remote", REMOTES)
def test_an_index_mixture_from_the_indexes_alone_reads_the_local_batches(remote, local, env, tmp_path):
    def mixture(indexes):
        sources = [Source(index=indexes[0], weight=2.0, name="a"), Source(index=indexes[1], name="b")]
        return ShardLoader(
            sources=sources, batch_size=6, image_size=32, threads=1, rank=1, world_size=2, **FAST
        )

    here = [index_of(local_spec(local, p), tmp_path / f"local-{p}.index") for p in ("a", "b")]
    there = [index_of(remote_spec(remote, p), tmp_path / f"remote-{p}.index") for p in ("a", "b")]
    assert batches(mixture(there)) == batches(mixture(here))


@pytest.mark.parametrize("remote", REMOTES)
def test_a_token_budget_loader_from_its_counts_alone_reads_the_local_batches(remote, local, env, tmp_path):
    def budget(spec):
        counts = count_patches(spec, naflex=SPEC, max_patches_per_batch=256, threads=1)
        return NaFlexBudgetLoader(counts, threads=1, rank=1, world_size=2)

    assert batches(budget(remote_spec(remote, "a"))) == batches(budget(local_spec(local, "a")))


@pytest.mark.parametrize("remote", REMOTES)
def test_a_text_mixture_from_saved_counts_alone_reads_the_local_batches(remote, local, env, tmp_path):
    def mixture(specs, where):
        saved = [str(tmp_path / f"{where}-{i}.tokens.json") for i in range(len(specs))]
        for spec, path in zip(specs, saved, strict=True):
            count_tokens(spec, tokenizer=GPT2_STYLE, threads=1, output=path)
        sources = [TextSource(saved[0], 2.0, "a"), TextSource(saved[1], 1.0, "b")]
        loader = TextMixture(sources, batch_size=3, seq_len=64, rank=1, world_size=2, threads=1)
        out = [b.input_ids.numpy().tobytes() for b in loader]
        assert out, "no batches: the comparison would hold vacuously"
        return out

    remote_specs = [
        f"s3://{BUCKET}/{p}/*.parquet" if remote == "s3" else f"hf://datasets/{REPO}/{p}/*.parquet"
        for p in ("ta", "tb")
    ]
    local_specs = [text_files(local, p) for p in ("ta", "tb")]
    assert mixture(remote_specs, "remote") == mixture(local_specs, "local")


def test_an_index_on_s3_over_s3_shards_is_all_a_loader_needs(local, env, tmp_path):
    """The index folder itself on S3, and no URL list: the shards are the index's ``s3://``
    URLs, signed when opened."""
    made = index_of(remote_spec("s3", "a"), tmp_path / "remote.index")
    client = env["s3"].client()
    for name in os.listdir(made):
        client.put_object(
            Bucket=BUCKET, Key=f"indexes/a.index/{name}", Body=open(os.path.join(made, name), "rb").read()
        )
    reference = batches(square(index_of(local_spec(local, "a"), tmp_path / "local.index")))
    assert batches(square(f"s3://{BUCKET}/indexes/a.index")) == reference


@pytest.fixture(scope="module")
def vlm_files(servers, tmp_path_factory):
    """An OBELICS-style Parquet pair, a caption tar and a text corpus, local and on both servers
    (under ``vlm/``), with the tokenizer they are counted with."""
    from interleaved_corpus import captions, real_documents, write_caption_tar, write_obelics_parquet
    from qwen_reference import write_tokenizer_json

    root = tmp_path_factory.mktemp("vlm-only")
    docs = real_documents(12, seed=5)
    files = {
        "obelics": [
            write_obelics_parquet(str(root / f"obelics-{i}.parquet"), docs[i::2], 3) for i in range(2)
        ],
        "pairs": [write_caption_tar(str(root / "pairs-0.tar"), 16, seed=1)],
        "text": write_parquet_corpus(
            str(root), [" ".join(captions()[i : i + 12]) for i in range(0, 300, 6)], files=1
        ),
    }
    for name, paths in files.items():
        servers["s3"].upload(BUCKET, paths, prefix=f"vlm/{name}/")
    pushed = {f"vlm/{n}/{os.path.basename(p)}": open(p, "rb").read() for n, ps in files.items() for p in ps}
    servers["hf"].push(REPO, pushed)
    return files, write_tokenizer_json(str(root / "tokenizer.json"))


@pytest.mark.parametrize("remote", REMOTES)
def test_a_vlm_mixture_from_saved_counts_alone_reads_the_local_batches(remote, vlm_files, env, tmp_path):
    from qwen_reference import EOS
    from shardstream import Captions, QwenVL, VlmMixture, VlmSource, count_interleaved, vlm_rows

    files, tokenizer = vlm_files
    rows = vlm_rows((0.5, 0.25, 0.25), 4)
    common = {"tokenizer": tokenizer, "spec": QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64),
              "seq_len": 512, "eos_token": EOS, "threads": 1}  # fmt: skip

    def where(name: str, suffix: str):
        if remote == "s3":
            return f"s3://{BUCKET}/vlm/{name}/*.{suffix}"
        return f"hf://datasets/{REPO}/vlm/{name}/*.{suffix}"

    def mixture(specs: dict[str, Any], tag: str):
        saved = {n: str(tmp_path / f"{tag}-{n}.json") for n in ("obelics", "pairs", "text")}
        count_interleaved(specs["obelics"], batch_size=rows[0], output=saved["obelics"], **common)
        count_interleaved(
            specs["pairs"], batch_size=rows[1], layout=Captions(), output=saved["pairs"], **common
        )
        count_tokens(specs["text"], tokenizer=tokenizer, threads=1, output=saved["text"])
        sources = [VlmSource(saved["obelics"], 0.5, "obelics"), VlmSource(saved["pairs"], 0.25, "pairs"),
                   VlmSource(saved["text"], 0.25, "text")]  # fmt: skip
        loader = VlmMixture(sources, batch_size=4, seed=7, pad_token_id=2, rank=1, world_size=2, threads=1)
        out = []
        for b in loader:
            digest = hashlib.sha256()
            for t in (b.input_ids, b.labels, b.pixel_values, b.image_grid_thw):
                digest.update(t.numpy().tobytes())
            out.append((list(b.keys), digest.hexdigest()))
        assert out, "no batches: the comparison would hold vacuously"
        return out

    remote_specs = {"obelics": where("obelics", "parquet"),
                    "pairs": where("pairs", "tar"), "text": where("text", "parquet")}  # fmt: skip
    assert mixture(remote_specs, "remote") == mixture(files, "local")
