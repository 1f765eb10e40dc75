"""The VLM mixture (``VlmMixture``): interleaved documents (OBELICS Parquet), image-caption pairs
(a WebDataset tar read as one-image documents, ``layout=Captions()``) and a text corpus (FineWeb-
style Parquet) in one epoch by token weight, on real photos and real captions. Every batch holds
each source's share of rows exactly as that source's own loader yields them, on 2 ranks and
through 2 DataLoader workers; no document is read twice; a stop and resume continues with exactly
the batches that would have followed; caption pairs become image-then-caption documents whose
caption alone is learned; and a source counted for another share is refused by name."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from interleaved_corpus import captions, real_documents, write_caption_tar, write_obelics_parquet  # noqa: E402
from qwen_reference import EOS, IMAGE_PAD, VISION_END, VISION_START, write_tokenizer_json  # noqa: E402
from shardstream import (  # noqa: E402
    Captions,
    InterleavedLoader,
    OptionError,
    QwenVL,
    TextLoader,
    VlmMixture,
    VlmSource,
    count_interleaved,
    count_tokens,
    vlm_rows,
)
from text_corpus import write_parquet_corpus  # noqa: E402

SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
SEQ_LEN, BATCH = 512, 4
WEIGHTS = (0.5, 0.25, 0.25)  # interleaved, captions, text: rows 2, 1, 1 of every batch
PAD = 2


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[VlmSource]:
    root = tmp_path_factory.mktemp("vlm-mix")
    tokenizer = write_tokenizer_json(str(root / "tokenizer.json"))
    rows = vlm_rows(WEIGHTS, BATCH)
    assert rows == [2, 1, 1]
    common = {"tokenizer": tokenizer, "spec": SPEC, "seq_len": SEQ_LEN, "eos_token": EOS, "threads": 2}
    docs = real_documents(24, seed=5)
    obelics = [write_obelics_parquet(str(root / f"obelics-{i}.parquet"), docs[i::2], 4) for i in range(2)]
    interleaved = count_interleaved(obelics, batch_size=rows[0], **common)
    pairs = [write_caption_tar(str(root / f"pairs-{i}.tar"), 40, seed=i) for i in range(2)]
    pair_counts = count_interleaved(pairs, batch_size=rows[1], layout=Captions(), **common)
    texts = [" ".join(captions()[i : i + 12]) for i in range(0, 900, 6)]
    text = count_tokens(write_parquet_corpus(str(root / "text"), texts, files=2), tokenizer=tokenizer)
    return [
        VlmSource(interleaved, WEIGHTS[0], "obelics"),
        VlmSource(pair_counts, WEIGHTS[1], "pairs"),
        VlmSource(text, WEIGHTS[2], "text"),
    ]


def mixture(sources, **kw) -> VlmMixture:
    return VlmMixture(sources, batch_size=BATCH, seed=7, pad_token_id=PAD, world_size=2, **kw)


def ending_with_the_mixture(loader, sources):
    """``loader`` planning its stream only up to the mixture's end, as the mixture's sources do
    (the mixture sets this private hook on its own loaders)."""
    loader._epoch_batches = mixture(sources)._epoch_batches
    return loader


def alone(sources, rank: int) -> list[list]:
    """Each source's batches as its own loader yields them on ``rank`` of 2 (the mixture's seeds),
    its stream planned up to the mixture's end."""
    out = []
    for i, s in enumerate(sources):
        seed = 7 * 1_000_003 + i
        if s.name == "text":
            loader = TextLoader(
                s.counts, batch_size=1, seq_len=SEQ_LEN, seed=seed, boundaries=True, rank=rank, world_size=2
            )
            out.append([b.input_ids.clone() for b in ending_with_the_mixture(loader, sources)])
        else:
            loader = InterleavedLoader(s.counts, seed=seed, pad_token_id=PAD, rank=rank, world_size=2)
            loader = ending_with_the_mixture(loader, sources)
            out.append(
                [(b.input_ids.clone(), b.labels.clone(), b.pixel_values.clone(), b.keys) for b in loader]
            )
    return out


def test_every_batch_holds_each_sources_share_as_its_own_loader_yields_it(sources):
    """Rows 0-1 of every batch are the interleaved source's, row 2 the caption pairs', row 3 the
    text corpus's, each exactly as that source's loader yields it alone (ids, labels, pixels in
    order); the text row's labels are its ids with each sequence's first token masked; the
    mixture is as long as its shortest source allows, the same on both ranks, and no document is
    read twice over the ranks."""
    lengths = []
    begun = 0
    for rank in range(2):
        mix = mixture(sources, rank=rank)
        own = alone(sources, rank)
        batches = list(mix)
        lengths.append(len(batches))
        assert len(batches) == len(mix) == max(len(o) for o in own) == min(len(o) for o in own) > 2
        for j, b in enumerate(batches):
            ids0, labels0, pixels0, keys0 = own[0][j]
            ids1, labels1, pixels1, keys1 = own[1][j]
            assert torch.equal(b.input_ids[:2], ids0) and torch.equal(b.labels[:2], labels0)
            assert torch.equal(b.input_ids[2:3], ids1) and torch.equal(b.labels[2:3], labels1)
            assert torch.equal(b.input_ids[3:], own[2][j])
            assert torch.equal(b.pixel_values, torch.cat([pixels0, pixels1]))
            assert b.keys == keys0 + keys1
            assert all(k.startswith("doc-") for k in keys0) and all(k.startswith("pair-") for k in keys1)
            starts = b.cu_seqlens[:-1].long()
            text_starts = starts[starts >= 3 * SEQ_LEN] - 3 * SEQ_LEN
            expected = own[2][j].clone().view(-1)
            expected[text_starts] = -100
            assert torch.equal(b.labels[3], expected)
            assert int(b.cu_seqlens[-1]) == BATCH * SEQ_LEN
            begun += b.documents
        stats = mix.stats["tokens_by_source"]
        assert stats["obelics"] == 2 * stats["pairs"] == 2 * stats["text"] == 2 * len(batches) * SEQ_LEN
    assert lengths[0] == lengths[1]
    # Documents begun over both ranks: never more than the sources hold (each source's own
    # loader reads a document once an epoch; the mixture stops where the shortest runs out).
    assert begun <= sources[0].counts.documents + sources[1].counts.documents


def test_a_caption_pair_is_its_image_then_its_caption_and_only_the_caption_is_learned(sources):
    """Each pair is ``<|vision_start|>`` + its pads + ``<|vision_end|>``, then its caption's
    tokens, then the EOS: the labels are -100 over the image run and the caption's tokens after
    its first one (the sequence's first token is never learned)."""
    from tokenizers import Tokenizer

    counts = sources[1].counts
    tok = Tokenizer.from_file(counts.tokenizer)
    start, end, pad = (tok.token_to_id(t) for t in (VISION_START, VISION_END, IMAGE_PAD))
    eos = tok.token_to_id(EOS)
    loader = InterleavedLoader(counts, pad_token_id=PAD)
    pairs = 0
    for b in loader:
        for row, labels in zip(b.input_ids.tolist(), b.labels.tolist(), strict=True):
            at = 0
            while at < len(row) and row[at] == start:
                close = row.index(end, at)
                assert set(row[at + 1 : close]) == {pad}
                stop = row.index(eos, close)
                assert all(x == -100 for x in labels[at : close + 1])
                assert labels[close + 1 : stop + 1] == row[close + 1 : stop + 1]
                assert tok.decode(row[close + 1 : stop]).strip() in {c.strip() for c in captions()}
                pairs += 1
                at = stop + 1
    assert pairs == counts.documents == 80


def test_a_caption_pair_without_its_image_or_caption_is_skipped_with_its_reason(sources, tmp_path):
    """A pair lacking its jpg is ``missing_image``, one lacking its txt ``missing_text``; the
    other pairs of the shard are read. A one-row source counts under the default spec."""
    path = write_caption_tar(str(tmp_path / "bad.tar"), 6, bad={1: "jpg", 4: "txt"})
    tokenizer = sources[1].counts.tokenizer
    layout = Captions()
    counts = count_interleaved(
        path, tokenizer=tokenizer, spec=SPEC, seq_len=SEQ_LEN, batch_size=1, layout=layout
    )
    assert counts.skipped == {"missing_image": 1, "missing_text": 1} and counts.documents == 4
    # A one-row source under the default spec: the default patch cap (4 x rows x seq_len = 2,048)
    # is raised to one largest image (5,120 patches) instead of refusing the count.
    default = count_interleaved(path, tokenizer=tokenizer, seq_len=SEQ_LEN, batch_size=1, layout=Captions())
    assert default.settings["max_patches_per_batch"] == QwenVL().max_patches == 5120


def test_a_stop_and_resume_continues_with_the_batches_that_would_have_followed(sources):
    """Stopped after 2 batches on rank 1 and resumed from the state in a new mixture: exactly the
    uninterrupted run's batches 3.. (ids, labels, pixels); through 2 DataLoader workers, every
    source's rows are still its own share."""

    def kept(b) -> tuple:
        return (b.input_ids.clone(), b.labels.clone(), b.pixel_values.clone())

    whole = [kept(b) for b in mixture(sources, rank=1)]
    first = mixture(sources, rank=1)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    it.close()
    resumed = mixture(sources, rank=1)
    resumed.load_state_dict(state)
    rest = [kept(b) for b in resumed]
    assert len(rest) == len(whole) - 2
    for got, want in zip(rest, whole[2:], strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    through = [b.input_ids.clone() for b in mixture(sources, rank=0).dataloader(2)]
    own = InterleavedLoader(sources[0].counts, seed=7 * 1_000_003, pad_token_id=PAD, rank=0, world_size=2)
    own = ending_with_the_mixture(own, sources)
    own_through = [b.input_ids.clone() for b in own.dataloader(2)]
    assert len(through) == len(mixture(sources, rank=0)) > 2
    for j, ids in enumerate(through):
        assert torch.equal(ids[:2], own_through[j])


def test_a_resume_onto_three_ranks_reads_no_sources_batch_twice(sources):
    """Stopped after 2 batches on each of 2 ranks and resumed onto 3: the state is the same on
    every rank, every new rank yields the same number of batches, and over the batches read
    before and after, no source's part of a batch (its rows, pixels included) is read twice.
    The batches left do not divide among 3 ranks: the ranks short of one get padding (no
    labels), which is no source's batch."""
    seen: list[set] = [set(), set(), set()]
    padding = [0, 0, 0]

    def note(b) -> None:
        for i, (a, e) in enumerate([(0, 2), (2, 3), (3, 4)]):
            if bool((b.labels[a:e] == -100).all()) and bool((b.input_ids[a:e] == PAD).all()):
                padding[i] += 1
                continue
            part = hashlib.sha256(b.input_ids[a:e].numpy().tobytes() + b.labels[a:e].numpy().tobytes())
            digest = part.hexdigest()
            assert digest not in seen[i], f"source {i}'s rows read twice"
            seen[i].add(digest)

    states = []
    for rank in range(2):
        first = mixture(sources, rank=rank)
        it = iter(first)
        for _ in range(2):
            note(next(it))
        states.append(first.state_dict())
        it.close()
    assert states[0] == states[1], "the state is the same on every rank"
    lengths = []
    for rank in range(3):
        resumed = VlmMixture(sources, batch_size=BATCH, seed=7, pad_token_id=PAD, rank=rank, world_size=3)
        resumed.load_state_dict(states[0])
        batches = list(resumed)
        lengths.append(len(batches))
        for b in batches:
            note(b)
    assert len(set(lengths)) == 1 and lengths[0] > 0, lengths
    left = 2 * (len(mixture(sources, rank=0)) - 2)
    assert padding[:2] == [3 * lengths[0] - left] * 2, (padding, lengths, left)


def test_a_source_counted_for_another_share_or_tokenizer_is_refused_by_name(sources, tmp_path):
    """An image-text source counted with another batch_size than its rows is refused, naming the
    batch_size to count it with; a source counted with another tokenizer is refused; a weight
    that leaves a source no row is refused."""
    with pytest.raises(OptionError, match="'pairs'.*batch_size=2"):
        VlmMixture([sources[0], VlmSource(sources[1].counts, 0.5, "pairs")], batch_size=4, world_size=2)
    other = write_tokenizer_json(str(tmp_path / "other.json"))
    with open(other, "a") as f:
        f.write("\n")  # the same vocabulary, other bytes: another fingerprint
    texts = write_parquet_corpus(str(tmp_path / "text"), list(captions()[:200]), files=1)
    with pytest.raises(ValueError, match="different tokenizers"):
        text = VlmSource(count_tokens(texts, tokenizer=other), 0.5)
        VlmMixture([sources[0], text], batch_size=4, world_size=2)
    with pytest.raises(OptionError, match="none"):
        VlmMixture([sources[0], VlmSource(sources[2].counts, 0.01, "text")], batch_size=2, world_size=2)
    with pytest.raises(ValueError, match="image-text source"):
        VlmMixture([sources[2]], batch_size=1, world_size=2)
    np.testing.assert_equal(vlm_rows([3, 1], 8), [6, 2])
