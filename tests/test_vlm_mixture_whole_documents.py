"""A VLM mixture's epoch learns every document whole or not at all (issue 51, part 2).

A long document is cut across batches. A mixture's epoch ends where its shortest source runs
out, and after a stop on one world size and a resume on another, the rest of the epoch is cut
anew: a document with a batch no rank reads must not be learned in part. The rule (the
interleaved guide's "Whole documents"): each source plans its stream only up to the mixture's
end, so every batch it plans is read; a document with a batch no rank reads (past that end, or
in a phase's remainder) keeps its runs as context without labels, counted in
``stats["cut_documents"]``.

Checked on real photos and real captions, by key and by learned token count, against each source
read whole on one rank (packing is per unit, so a document's runs do not depend on the world
size): over an uninterrupted epoch on 2 ranks, and over one stopped on 2 ranks after 4 batches and
resumed onto 3, every document present is learned exactly as it is whole, or not at all when the
epoch cuts it; cut documents exist (the check is not vacuous) and the uninterrupted epoch's
``cut_documents`` counts them.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

torch = pytest.importorskip("torch")

from interleaved_corpus import captions, real_documents, write_caption_tar, write_obelics_parquet  # noqa: E402
from qwen_reference import EOS, write_tokenizer_json  # noqa: E402
from shardstream import (  # noqa: E402
    Captions,
    InterleavedLoader,
    QwenVL,
    VlmMixture,
    VlmSource,
    count_interleaved,
    count_tokens,
    vlm_rows,
)
from text_corpus import write_parquet_corpus  # noqa: E402

SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
SEQ_LEN, BATCH, SEED = 128, 4, 11
WEIGHTS = (0.5, 0.25, 0.25)  # documents, caption pairs, text: rows 2, 1, 1
# Padding written with an id no token has, so a padding segment is told from a document's run.
PAD = 1_000_000
IMAGE_TEXT = (("obelics", 0, 2), ("pairs", 2, 3))  # (name, first row, end row) of each batch


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[VlmSource]:
    root = tmp_path_factory.mktemp("vlm-whole")
    tokenizer = write_tokenizer_json(str(root / "tokenizer.json"))
    rows = vlm_rows(WEIGHTS, BATCH)
    common = {"tokenizer": tokenizer, "spec": SPEC, "seq_len": SEQ_LEN, "eos_token": EOS, "threads": 2}
    docs = real_documents(60, seed=8)
    files = [write_obelics_parquet(str(root / f"obelics-{i}.parquet"), docs[i::4], 8) for i in range(4)]
    obelics = count_interleaved(files, batch_size=rows[0], **common)
    pairs = [write_caption_tar(str(root / f"pairs-{i}.tar"), 30, seed=20 + i) for i in range(3)]
    pair_counts = count_interleaved(pairs, batch_size=rows[1], layout=Captions(), **common)
    texts = [" ".join(captions()[i : i + 12]) for i in range(0, 990, 3)]
    text = count_tokens(write_parquet_corpus(str(root / "text"), texts, files=3), tokenizer=tokenizer)
    return [
        VlmSource(obelics, WEIGHTS[0], "obelics"),
        VlmSource(pair_counts, WEIGHTS[1], "pairs"),
        VlmSource(text, WEIGHTS[2], "text"),
    ]


def runs(batch, first_row: int, end_row: int, keys: list[str]) -> list[tuple[str, int]]:
    """(key, learned tokens) of each document run in rows ``first_row .. end_row`` of ``batch``,
    whose runs' keys are ``keys`` in order: a run is a ``cu_seqlens`` segment that is not
    padding."""
    ids, labels = batch.input_ids.view(-1), batch.labels.view(-1)
    cu = batch.cu_seqlens.tolist()
    out = []
    for a, b in zip(cu, cu[1:], strict=False):
        if not first_row * SEQ_LEN <= a < end_row * SEQ_LEN or bool((ids[a:b] == PAD).all()):
            continue
        out.append(int((labels[a:b] != -100).sum()))
    assert len(out) == len(keys), (len(out), len(keys))
    return list(zip(keys, out, strict=True))


def note(batch, seen: dict[str, dict[str, list[int]]]) -> None:
    """Adds each image-text run of a mixture batch to ``seen[source][key]``."""
    split = len([k for k in batch.keys if k.startswith("doc-")])
    parts = {"obelics": batch.keys[:split], "pairs": batch.keys[split:]}
    for name, first, end in IMAGE_TEXT:
        for key, learned in runs(batch, first, end, parts[name]):
            seen[name][key].append(learned)


@pytest.fixture(scope="module")
def whole(sources) -> dict[str, dict[str, list[int]]]:
    """Each image-text source read whole on one rank: every document's runs (learned tokens)."""
    out: dict[str, dict[str, list[int]]] = {}
    for i, (name, _, _) in enumerate(IMAGE_TEXT):
        loader = InterleavedLoader(
            sources[i].counts, seed=SEED * 1_000_003 + i, pad_token_id=PAD, world_size=1, rank=0
        )
        per: dict[str, list[int]] = defaultdict(list)
        for b in loader:
            for key, learned in runs(b, 0, loader.batch_size, b.keys):
                per[key].append(learned)
        assert loader.stats["cut_documents"] == 0
        out[name] = dict(per)
    return out


def mixture(sources, rank: int, world_size: int) -> VlmMixture:
    return VlmMixture(
        sources, batch_size=BATCH, seed=SEED, pad_token_id=PAD, rank=rank, world_size=world_size
    )


def check_whole_or_none(seen, whole) -> dict[str, set[str]]:
    """Every document seen is learned exactly as it is whole, or (cut: fewer runs seen than it
    has) not at all; returns the cut keys of each source."""
    cut: dict[str, set[str]] = {}
    for name, per in seen.items():
        cut[name] = set()
        for key, learned in per.items():
            runs_whole = whole[name][key]
            assert len(learned) <= len(runs_whole), f"{key}: a run read twice"
            if len(learned) < len(runs_whole):
                cut[name].add(key)
                assert sum(learned) == 0, f"{key} of {name} is read in part but learned: {learned}"
            else:
                assert Counter(learned) == Counter(runs_whole), f"{key} of {name}: {learned} != {runs_whole}"
    return cut


def test_an_uninterrupted_epoch_on_two_ranks_learns_each_document_whole_or_not_at_all(sources, whole):
    seen: dict[str, dict[str, list[int]]] = {name: defaultdict(list) for name, _, _ in IMAGE_TEXT}
    counted = Counter()
    for rank in range(2):
        mix = mixture(sources, rank, 2)
        for b in mix:
            note(b, seen)
        for name, _, _ in IMAGE_TEXT:
            counted[name] += mix.stats["sources"][name]["cut_documents"]
    cut = check_whole_or_none(seen, whole)
    assert cut["obelics"], "the epoch's end cuts no document: the check would be vacuous"
    assert {name: len(keys) for name, keys in cut.items()} == dict(counted)


@pytest.mark.parametrize("stop", ["after 4 batches", "one batch before the end"])
def test_a_stop_on_two_ranks_resumed_onto_three_learns_each_document_whole_or_not_at_all(
    sources, whole, stop
):
    """Stopped one batch before the end, 2 batches of each source are left: they do not divide
    among 3 ranks, and the documents begun before the stop that go on into them must still be
    read to their end (a rank short of a batch reads one of padding)."""
    seen: dict[str, dict[str, list[int]]] = {name: defaultdict(list) for name, _, _ in IMAGE_TEXT}
    states = []
    epoch = len(mixture(sources, 0, 2))
    done = 4 if stop == "after 4 batches" else epoch - 1
    for rank in range(2):
        first = mixture(sources, rank, 2)
        it = iter(first)
        for _ in range(done):
            note(next(it), seen)
        states.append(first.state_dict())
        it.close()
    lengths, padding = [], Counter()
    for rank in range(3):
        resumed = mixture(sources, rank, 3)
        resumed.load_state_dict(states[0])
        batches = list(resumed)
        lengths.append(len(batches))
        for b in batches:
            note(b, seen)
        for name, per in resumed.stats["sources"].items():
            padding[name] += per["padding_batches"]
    left = 2 * (epoch - done)  # each source's batches left
    assert lengths == [-(-left // 3)] * 3, lengths
    # Each source reads its batches left, the short ranks one of padding each.
    assert padding["obelics"] == padding["pairs"] == 3 * lengths[0] - left, padding
    # The text source leaves its remainder as packed text does; its parts past it are padding.
    assert padding["text"] == 3 * (lengths[0] - left // 3), padding
    cut = check_whole_or_none(seen, whole)
    assert cut["obelics"], "the epoch cuts no document: the check would be vacuous"
    learned = sum(sum(v) for per in seen.values() for v in per.values())
    assert learned == sum(
        sum(whole[name][key]) for name, per in seen.items() for key in per if key not in cut[name]
    )
