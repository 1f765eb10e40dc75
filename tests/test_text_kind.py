"""The packed text kind on real text (standard library sources and the real captions): document
ids equal the ``tokenizers`` package's, rows are the corpus's token stream cut into rows, every
token is in exactly one row per epoch across ranks (but the reported remainder), a resume goes on
at the exact next token, also onto another world size, and bad input is a typed reason."""

from __future__ import annotations

import functools
import os
from collections import Counter

import numpy as np
import pytest
import shardstream
from shardstream import TextLoader, TokenCounts, count_tokens
from shardstream.errors import OptionError, ShardError
from text_corpus import (
    BERT_STYLE,
    GPT2_STYLE,
    documents,
    llama3_style_tokenizer,
    parquet_units,
    stdlib_sources,
    write_code_tars,
    write_parquet_corpus,
)

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return documents(60)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, docs) -> list[str]:
    return write_parquet_corpus(str(tmp_path_factory.mktemp("fineweb")), docs, files=3, rows_per_group=40)


@pytest.fixture(scope="module")
def counts(corpus, tmp_path_factory) -> TokenCounts:
    path = tmp_path_factory.mktemp("counts") / "corpus.tokens.json.gz"
    return count_tokens(corpus, tokenizer=GPT2_STYLE, text_key="text", threads=2, output=path)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, docs) -> tuple[list[str], TokenCounts]:
    """Captions and a few short modules: DataLoader worker passes start often here."""
    short = [d for d in docs if len(d) < 20_000][:600]
    paths = write_parquet_corpus(str(tmp_path_factory.mktemp("small")), short, files=2, rows_per_group=30)
    return paths, count_tokens(paths, tokenizer=GPT2_STYLE)


def reference_ids(tokenizer: str, texts: list[str], eos: str, bos: str | None = None) -> list[list[int]]:
    """Each text as the ``tokenizers`` package encodes it, with the BOS and EOS around it."""
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    head = [tok.token_to_id(bos)] if bos else []
    return [head + e.ids + [tok.token_to_id(eos)] for e in tok.encode_batch(texts, add_special_tokens=False)]


@functools.cache
def _unit_streams(paths: tuple[str, ...], tokenizer: str, eos: str) -> list[list[int]]:
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    eos_id = tok.token_to_id(eos)
    return [
        [i for text in unit for i in tok.encode(text, add_special_tokens=False).ids + [eos_id]]
        for unit in parquet_units(list(paths))
    ]


def unit_streams(paths: list[str], tokenizer: str = GPT2_STYLE, eos: str = "</s>") -> list[list[int]]:
    """Each row group's documents as the reference package encodes them, EOS after each."""
    return _unit_streams(tuple(paths), tokenizer, eos)


def rows_of(loader: TextLoader) -> list[np.ndarray]:
    return [row.copy() for batch in loader for row in batch.input_ids.numpy()]


def test_document_ids_are_the_tokenizers_packages_for_three_tokenizer_styles(tmp_path, docs):
    assert any(ord(ch) > 0xFFFF for d in docs for ch in d), "astral-plane characters are in the corpus"
    assert any(ord(ch) > 127 for d in docs for ch in d)
    llama = llama3_style_tokenizer(str(tmp_path / "llama3-style.json"), docs[::4])
    cases = [
        (GPT2_STYLE, "</s>", None, None),  # the EOS found by its usual name
        (BERT_STYLE, "[SEP]", None, "[SEP]"),  # a separator named as the EOS
        (llama, "<|end_of_text|>", "<|begin_of_text|>", None),
    ]
    for path, eos, bos, named_eos in cases:
        got = shardstream._core.packed_encode(path, docs, named_eos, bos)
        want = reference_ids(path, docs, eos, bos)
        assert got == want, os.path.basename(path)


def test_counts_are_the_tokens_of_every_row_group_and_survive_a_save(counts, corpus, tmp_path):
    streams = unit_streams(corpus)
    assert [u["tokens"] for u in counts.units] == [len(s) for s in streams]
    assert counts.documents == sum(len(u) for u in parquet_units(corpus))
    assert [u["rows"] for u in counts.units] == [len(u) for u in parquet_units(corpus)]
    counts.save(tmp_path / "c.json")
    assert TokenCounts.load(tmp_path / "c.json") == counts


def test_one_rank_in_stream_order_yields_the_row_groups_token_streams_cut_into_rows(counts, corpus):
    seq_len, batch = 96, 3
    loader = TextLoader(counts, batch_size=batch, seq_len=seq_len, block_rows=1, rank=0, world_size=1)
    flat = np.concatenate(rows_of(loader)).tolist()
    assert len(flat) == len(loader) * batch * seq_len
    assert len(flat) + loader.stats["remainder_tokens"] == counts.total_tokens
    # The rows tile the units' streams, each whole and in its own order (units are shuffled).
    streams = unit_streams(corpus)
    left, at = list(range(len(streams))), 0
    while at < len(flat):
        match = [
            u for u in left if streams[u] and flat[at : at + len(streams[u])] == streams[u][: len(flat) - at]
        ]
        assert len(match) == 1, f"no unit's tokens at {at}"
        left.remove(match[0])
        at += len(streams[match[0]])
    assert sum(len(streams[u]) for u in left) + at - len(flat) == loader.stats["remainder_tokens"]


def epoch_rows(counts: TokenCounts, world: int, **kw) -> list[list[np.ndarray]]:
    out = []
    for rank in range(world):
        loader = TextLoader(counts, rank=rank, world_size=world, **kw)
        out.append(rows_of(loader))
    return out


def assert_every_token_once(counts, corpus, rows: list[np.ndarray], remainder: int) -> None:
    want = Counter(t for s in unit_streams(corpus) for t in s)
    got = Counter(int(t) for r in rows for t in r)
    assert not got - want, "a token was read more often than the corpus holds it"
    assert sum((want - got).values()) == remainder


def test_two_ranks_read_every_token_once_with_equal_batches_and_a_fresh_order_per_epoch(counts, corpus):
    kw = dict(batch_size=4, seq_len=64, block_rows=8, seed=3)
    ranks = epoch_rows(counts, 2, **kw)
    assert len(ranks[0]) == len(ranks[1]) == len(TextLoader(counts, rank=0, world_size=2, **kw)) * 4
    remainder = TextLoader(counts, rank=0, world_size=2, **kw).stats["remainder_tokens"]
    assert 0 <= remainder < 2 * 4 * 64
    assert_every_token_once(counts, corpus, ranks[0] + ranks[1], remainder)
    again = epoch_rows(counts, 2, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(ranks[0] + ranks[1], again[0] + again[1], strict=True))
    other = TextLoader(counts, rank=0, world_size=2, **kw)
    other.set_epoch(1)
    assert not all(np.array_equal(a, b) for a, b in zip(ranks[0], rows_of(other), strict=False))


def test_a_resume_mid_epoch_gives_exactly_the_batches_that_would_have_followed(counts):
    kw = dict(batch_size=2, seq_len=80, block_rows=5, seed=11, rank=1, world_size=2)
    whole = rows_of(TextLoader(counts, **kw))
    first = TextLoader(counts, **kw)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.state_dict()
    it.close()
    resumed = TextLoader(counts, **kw)
    resumed.load_state_dict(state)
    assert len(resumed) == len(whole) // 2 - 7
    rest = rows_of(resumed)
    assert len(rest) == len(whole) - 14
    assert all(np.array_equal(a, b) for a, b in zip(rest, whole[14:], strict=True))


def test_an_elastic_resume_from_two_ranks_onto_three_reads_every_token_left_once(counts, corpus):
    kw = dict(batch_size=3, seq_len=50, block_rows=4, seed=5)
    seen: list[np.ndarray] = []
    state = None
    for rank in range(2):
        loader = TextLoader(counts, rank=rank, world_size=2, **kw)
        it = iter(loader)
        for _ in range(9):
            seen.extend(row.copy() for row in next(it).input_ids.numpy())
        state = loader.state_dict()
        it.close()
    lengths = []
    for rank in range(3):
        loader = TextLoader(counts, rank=rank, world_size=3, **kw)
        loader.load_state_dict(state)
        rows = rows_of(loader)
        lengths.append(len(rows))
        seen.extend(rows)
    assert len(set(lengths)) == 1
    assert_every_token_once(counts, corpus, seen, loader.stats["remainder_tokens"])


def test_boundaries_restart_positions_at_every_document_and_give_cu_seqlens(counts):
    loader = TextLoader(
        counts, batch_size=4, seq_len=128, boundaries=True, rank=0, world_size=1, dtype="int32"
    )
    eos = tokenizers.Tokenizer.from_file(GPT2_STYLE).token_to_id("</s>")
    checked = 0
    for batch in loader:
        ids, pos = batch.input_ids.numpy(), batch.position_ids.numpy()
        assert ids.dtype == np.int32 and pos.shape == ids.shape
        flat_pos = pos.reshape(-1)
        starts = np.flatnonzero(flat_pos == 0)
        cu = batch.cu_seqlens.numpy()
        assert cu.tolist() == [*starts.tolist(), ids.size]
        assert batch.max_seqlen == int(np.diff(cu).max())
        for r in range(ids.shape[0]):
            after_eos = np.flatnonzero(ids[r][:-1] == eos) + 1
            assert set(after_eos) <= set(np.flatnonzero(pos[r] == 0))
        checked += 1
        if checked == 5:
            break
    assert batch.labels is batch.input_ids


def test_code_tars_with_an_invalid_utf8_member_count_it_and_pack_the_rest(tmp_path):
    sources = [(name, text.encode()) for name, text in stdlib_sources(12)]
    sources.insert(3, ("broken", b"def f():\n    return '\xff\xfe'\n"))
    tars = write_code_tars(str(tmp_path / "code"), sources, shards=2)
    counts = count_tokens(str(tmp_path / "code" / "*.tar"), tokenizer=GPT2_STYLE, text_key="py")
    assert counts.skipped == {"bad_utf8": 1}
    assert counts.documents == len(sources) - 1
    assert len(counts.units) == len(tars) and all(u["rows"] is None for u in counts.units)
    good = [t.decode() for n, t in sources if n != "broken"]
    want = sum(map(len, reference_ids(GPT2_STYLE, good, "</s>")))
    assert counts.total_tokens == want
    loader = TextLoader(counts, batch_size=2, seq_len=256, rank=0, world_size=1)
    assert len(rows_of(loader)) == len(loader) * 2 > 0


def test_a_json_field_of_tar_samples_is_the_document(tmp_path):
    import json

    from corpus import tar_bytes, write_file

    texts = [s for _, s in stdlib_sources(4)]
    members = [
        (f"doc{i}.json", json.dumps({"text": t, "url": f"u{i}"}).encode()) for i, t in enumerate(texts)
    ]
    members.append(("doc9.json", json.dumps({"url": "no text"}).encode()))
    path = write_file(str(tmp_path / "docs.tar"), tar_bytes(members))
    counts = count_tokens(path, tokenizer=GPT2_STYLE, text_key="json:text")
    assert counts.skipped == {"missing_text": 1}
    assert counts.total_tokens == sum(map(len, reference_ids(GPT2_STYLE, texts, "</s>")))


def test_bad_input_is_a_clear_error_naming_it(tmp_path, corpus, counts):
    not_json = tmp_path / "tokenizer.json"
    not_json.write_text("{ this is not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        count_tokens(corpus, tokenizer=str(not_json))
    with pytest.raises(ValueError, match="eos_token"):
        count_tokens(corpus, tokenizer=BERT_STYLE)  # no usual EOS name in a BERT vocabulary
    with pytest.raises(
        ValueError, match=r'missing_column in 3 files .*no text column "content" \(its columns: id'
    ):
        count_tokens(corpus, tokenizer=GPT2_STYLE, text_key="content")
    empty = write_parquet_corpus(str(tmp_path / "empty"), [], files=1)
    with pytest.raises(ValueError, match="no document"):
        count_tokens(empty, tokenizer=GPT2_STYLE)
    with pytest.raises(OptionError, match="seq_len"):
        TextLoader(counts, batch_size=2, seq_len=0)
    with pytest.raises(ValueError, match="less than one global batch"):
        TextLoader(counts, batch_size=64, seq_len=1 << 20, world_size=1, rank=0)


def test_a_document_over_the_size_limit_is_skipped_and_counted_not_loaded(tmp_path, docs):
    big = "x = 1\n" * 50_000  # 300 KB of code
    paths = write_parquet_corpus(str(tmp_path / "big"), [*docs[:20], big], files=1, rows_per_group=100)
    counts = count_tokens(paths, tokenizer=GPT2_STYLE, max_document_bytes=200_000)
    assert counts.skipped == {"member_too_large": 1}
    assert counts.documents == 20


def test_a_file_changed_after_counting_is_refused_by_name(tmp_path, docs):
    paths = write_parquet_corpus(str(tmp_path / "c"), docs[:200], files=1, rows_per_group=50)
    counts = count_tokens(paths, tokenizer=GPT2_STYLE)
    write_parquet_corpus(str(tmp_path / "c"), docs[:150], files=1, rows_per_group=50)
    loader = TextLoader(counts, batch_size=1, seq_len=32, rank=0, world_size=1)
    with pytest.raises(ShardError, match="part-000.parquet"):
        rows_of(loader)


def test_counts_made_with_another_tokenizer_file_are_refused(tmp_path, counts):
    import shutil

    copy = tmp_path / "tok.json"
    shutil.copy(GPT2_STYLE, copy)
    other = count_tokens(counts.units[0]["url"], tokenizer=str(copy))
    copy.write_text(open(GPT2_STYLE).read() + "\n")  # the same vocabulary, other bytes
    with pytest.raises(ValueError, match="changed since the tokens were counted"):
        TextLoader(other, batch_size=1, seq_len=8, rank=0, world_size=1)
    state = TextLoader(counts, batch_size=1, seq_len=8, rank=0, world_size=1).state_dict()
    os.remove(copy)
    with pytest.raises(ValueError, match="does not exist"):
        TextLoader(other, batch_size=1, seq_len=8, rank=0, world_size=1)
    small = TokenCounts(**{**counts.__dict__, "units": counts.units[:2]})
    with pytest.raises(ValueError, match="other token counts"):
        TextLoader(small, batch_size=1, seq_len=8, rank=0, world_size=1).load_state_dict(state)


def test_the_cli_indexes_and_validates_a_text_corpus(tmp_path, small_corpus):
    from cli_runs import run_cli

    corpus, counts = small_corpus
    out = tmp_path / "corpus.tokens.json.gz"
    tok = ["--tokenizer", GPT2_STYLE, "--text-key", "text"]
    run = run_cli(["index", *corpus, *tok, "-o", str(out)])
    assert run.returncode == 0, run.stderr
    assert TokenCounts.load(out) == counts
    assert f"{counts.total_tokens:,} tokens" in run.stdout
    run = run_cli(["validate", *corpus, *tok])
    assert (run.returncode, "all documents valid" in run.stdout) == (0, True), run.stdout + run.stderr
    run = run_cli(
        ["index", *corpus, "--tokenizer", GPT2_STYLE, "--text-key", "body", "-o", str(tmp_path / "x.json")]
    )
    assert run.returncode == 2 and 'no text column "body"' in run.stderr, run.stderr
    assert not (tmp_path / "x.json").exists()
    bad = write_code_tars(str(tmp_path / "bad"), [("ok", b"x = 1\n"), ("latin1", b"s = '\xe9'\n")], shards=1)
    run = run_cli(
        ["validate", *bad, "--tokenizer", GPT2_STYLE, "--text-key", "py", "--json", str(tmp_path / "r.json")]
    )
    assert run.returncode == 1 and "bad_utf8 1" in run.stdout, run.stdout
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["skipped"] == {"bad_utf8": 1} and report["examples"][0]["key"] == "latin1"


def test_two_ranks_with_two_dataloader_workers_each_read_every_token_once_and_resume_exactly(small_corpus):
    corpus, counts = small_corpus
    kw = dict(batch_size=4, seq_len=64, block_rows=6, seed=2)
    seen: list[np.ndarray] = []
    whole: dict[int, list[np.ndarray]] = {}
    for rank in range(2):
        batches = TextLoader(counts, rank=rank, world_size=2, **kw).dataloader(2)
        whole[rank] = [row.copy() for b in batches for row in b.input_ids.numpy()]
        assert batches.stats["tokens"] == len(whole[rank]) * 64, "both workers' counters merged"
    assert len(whole[0]) == len(whole[1])
    assert_every_token_once(counts, corpus, whole[0] + whole[1], batches.stats["remainder_tokens"])
    # Stopped after 5 batches (mid-round: worker 1's turn), resumed with the same workers.
    state = None
    for rank in range(2):
        loader = TextLoader(counts, rank=rank, world_size=2, **kw)
        batches = loader.dataloader(2)
        it = iter(batches)
        for _ in range(5):
            seen.extend(row.copy() for row in next(it).input_ids.numpy())
        state = batches.state_dict()
        del it
        resumed = TextLoader(counts, rank=rank, world_size=2, **kw)
        resumed.load_state_dict(state)
        rest = [row.copy() for b in resumed.dataloader(2) for row in b.input_ids.numpy()]
        assert all(np.array_equal(a, b) for a, b in zip(rest, whole[rank][20:], strict=True)), rank
        assert len(rest) == len(whole[rank]) - 20
    # The same state onto 3 ranks without workers: every token left once.
    for rank in range(3):
        loader = TextLoader(counts, rank=rank, world_size=3, **kw)
        loader.load_state_dict(state)
        seen.extend(rows_of(loader))
    assert_every_token_once(counts, corpus, seen, loader.stats["remainder_tokens"])


def test_long_documents_encode_to_the_packages_ids_in_memory_that_does_not_grow_with_them(tmp_path, docs):
    """A 3 MB document of real code and prose, as one document: the loader's ids are the
    package's whole-document ids for each tokenizer style (it encodes long documents in pieces
    cut where the tokenizer's pipeline splits), and encoding a 12 MB one peaks at a fraction of
    what the package itself takes for it (about 170 bytes per byte of text)."""
    import subprocess
    import sys

    llama = llama3_style_tokenizer(str(tmp_path / "llama3-style.json"), docs[::4])
    long_doc = "\n".join(docs)[: 3 << 20]
    for path, eos, bos, named in [
        (GPT2_STYLE, "</s>", None, None),
        (BERT_STYLE, "[SEP]", None, "[SEP]"),
        (llama, "<|end_of_text|>", "<|begin_of_text|>", None),
    ]:
        (got,) = shardstream._core.packed_encode(path, [long_doc], named, bos)
        assert got == reference_ids(path, [long_doc], eos, bos)[0], os.path.basename(path)
    probe = (
        "import resource, sys, shardstream._core as c\n"
        "text = open(sys.argv[1], encoding='utf-8').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "ids = c.packed_encode(sys.argv[2], [text])[0]\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, len(ids))\n"
    )
    big = tmp_path / "big.txt"
    big.write_text((long_doc + "\n") * 4, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", probe, str(big), llama], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    grown_mb, n = map(int, run.stdout.split())
    assert n > 1_000_000
    # The ids themselves (a Python list of ints) take about 36 bytes each; the encoder's own
    # memory stays near one piece's, instead of 170 x 12 MB = 2 GB.
    assert grown_mb < 40 * n / 1e6 + 200, (grown_mb, n)


def test_a_two_source_mixture_keeps_each_sources_share_of_every_batch_and_resumes_exactly(
    counts, small_corpus, tmp_path
):
    from shardstream import TextMixture, TextSource

    code = write_code_tars(str(tmp_path / "code"), [(n, t.encode()) for n, t in stdlib_sources(30)], shards=2)
    code_counts = count_tokens(code, tokenizer=GPT2_STYLE, text_key="py")
    sources = [TextSource(small_corpus[1], 0.7, "captions"), TextSource(code_counts, 0.3, "code")]
    kw = dict(batch_size=10, seq_len=48, block_rows=4, seed=4, world_size=2)
    mixes = [TextMixture(sources, rank=r, **kw) for r in range(2)]
    assert mixes[0].rows == [7, 3] and len(mixes[0]) == len(mixes[1]) > 0
    whole = [[b.input_ids.numpy().copy() for b in m] for m in mixes]
    # Rows 0..6 of every batch are the captions source's, rows 7..9 the code source's, each as
    # that corpus's own loader yields them: a 7:3 token share in every batch.
    for rank in range(2):
        parts = [
            TextLoader(
                c, batch_size=rows, seq_len=48, block_rows=4, seed=4 * 1_000_003 + i, rank=rank, world_size=2
            )
            for i, (c, rows) in enumerate([(small_corpus[1], 7), (code_counts, 3)])
        ]
        alone = [[b.input_ids.numpy().copy() for b in p] for p in parts]
        for j, batch in enumerate(whole[rank]):
            assert np.array_equal(batch[:7], alone[0][j]) and np.array_equal(batch[7:], alone[1][j])
    stats = mixes[0].stats["tokens_by_source"]
    assert stats["captions"] * 3 == stats["code"] * 7
    # Stopped after 4 batches and resumed: exactly the batches that would have followed.
    first = TextMixture(sources, rank=1, **kw)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    it.close()
    resumed = TextMixture(sources, rank=1, **kw)
    resumed.load_state_dict(state)
    rest = [b.input_ids.numpy().copy() for b in resumed]
    assert len(rest) == len(whole[1]) - 4
    assert all(np.array_equal(a, b) for a, b in zip(rest, whole[1][4:], strict=True))


def test_a_mixture_through_two_dataloader_workers_keeps_its_shares_and_order_and_resumes_exactly(
    small_corpus, tmp_path
):
    """TextMixture.dataloader(2): batch j holds every source's batch j as that source's own loader
    yields it through 2 workers (its share of rows, torch's round-robin order), no row of a
    source twice and the source that bounds the epoch read whole; stopped mid-round and resumed
    through the DataLoader, exactly the rows that would have followed; the pass after a resumed
    epoch's end reads the next epoch whole."""
    from shardstream import TextMixture, TextSource

    code = write_code_tars(str(tmp_path / "code"), [(n, t.encode()) for n, t in stdlib_sources(30)], shards=2)
    code_counts = count_tokens(code, tokenizer=GPT2_STYLE, text_key="py")
    sources = [TextSource(small_corpus[1], 0.7, "captions"), TextSource(code_counts, 0.3, "code")]
    kw = dict(batch_size=10, seq_len=48, block_rows=4, seed=4, world_size=2)
    cut = [(0, 7), (7, 10)]  # each source's rows of a batch

    def source_loader(i: int, rank: int) -> TextLoader:
        rows = cut[i][1] - cut[i][0]
        c = sources[i].counts
        return TextLoader(
            c, batch_size=rows, seq_len=48, block_rows=4, seed=4 * 1_000_003 + i, rank=rank, world_size=2
        )

    whole: dict[int, list[np.ndarray]] = {}
    got: list[Counter] = [Counter(), Counter()]
    epoch: list[Counter] = [Counter(), Counter()]
    for rank in range(2):
        batches = TextMixture(sources, rank=rank, **kw).dataloader(2)
        whole[rank] = [b.input_ids.numpy().copy() for b in batches]
        n = len(whole[rank])
        assert n == len(batches) > 6
        for i, (lo, hi) in enumerate(cut):
            alone = [b.input_ids.numpy().copy() for b in source_loader(i, rank).dataloader(2)]
            assert all(np.array_equal(b[lo:hi], alone[j]) for j, b in enumerate(whole[rank])), (rank, i)
            got[i].update(tuple(r) for b in whole[rank] for r in b[lo:hi])
            epoch[i].update(tuple(r) for r in rows_of(source_loader(i, rank)))  # no workers
        stats = batches.stats
        assert stats["tokens_by_source"] == {"captions": n * 7 * 48, "code": n * 3 * 48}
        for name in ("captions", "code"):  # both workers' counters merged (and batches filled ahead)
            assert stats["sources"][name]["tokens"] >= stats["tokens_by_source"][name]
    bounding = [len(source_loader(i, 0)) == len(whole[0]) for i in range(2)]
    assert any(bounding)
    for i in range(2):
        assert not got[i] - epoch[i], f"source {i}: a row that is not its epoch's, or one read twice"
        assert (got[i] == epoch[i]) == bounding[i], f"source {i}"
    # Stopped after 5 batches (worker 0 gave 3, worker 1 two), resumed through the DataLoader.
    first = TextMixture(sources, rank=1, **kw)
    batches = first.dataloader(2)
    it = iter(batches)
    for _ in range(5):
        next(it)
    state = batches.state_dict()
    del it
    resumed = TextMixture(sources, rank=1, **kw)
    resumed.load_state_dict(state)
    again = resumed.dataloader(2)
    rest = [b.input_ids.numpy().copy() for b in again]
    assert len(rest) == len(whole[1]) - 5
    assert all(np.array_equal(a, b) for a, b in zip(rest, whole[1][5:], strict=True))
    following = [b.input_ids.numpy().copy() for b in again]
    assert all(np.array_equal(a, b) for a, b in zip(following, whole[1], strict=True))
    assert len(following) == len(whole[1])


def test_a_gpt2_tokenizer_without_a_prefix_space_keeps_every_token_of_long_documents(tmp_path):
    """GPT-2's byte-level regex without a prefix space, trained here on real code: documents over
    the 64 KiB piece size (the standard library's longest modules, and the issue's
    ``"a = 1\\n\\n" x 10000``) give the package's ids, through ``packed_encode`` and
    ``count_tokens``. A cut after a blank line once lost one ``\\n`` token per cut."""
    import json

    from tokenizers import models, pre_tokenizers, trainers

    sources = [s for _, s in stdlib_sources(400)]
    long_docs = [s for s in sources if 64 << 10 < len(s.encode()) < 256 << 10]
    assert len(long_docs) >= 10, len(long_docs)
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sources[:40] + ["a = 1\n\n"] * 100, trainer)
    path = str(tmp_path / "gpt2-no-prefix.json")
    tok.save(path)
    texts = ["a = 1\n\n" * 10_000, *long_docs]
    want = reference_ids(path, texts, "<|endoftext|>")
    got = shardstream._core.packed_encode(path, texts, "<|endoftext|>", None)
    for text, g, w in zip(texts, got, want, strict=True):
        assert g == w, (text[:40], len(g), len(w))
    corpus = tmp_path / "long.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    counted = count_tokens(str(corpus), tokenizer=path)
    assert counted.total_tokens == sum(map(len, want))
