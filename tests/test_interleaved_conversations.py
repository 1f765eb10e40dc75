"""LLaVA-style multi-image conversations in WebDataset tars (``count_interleaved(...,
layout=Conversations())`` + ``InterleavedLoader``) on real photos and real captions: every
conversation's ids, grids and assistant-only labels equal what transformers' ``Qwen2VLProcessor``
gives through ``apply_chat_template(..., return_assistant_tokens_mask=True)`` under a ChatML
template (Qwen2-VL's, with ``{% generation %}`` markers), its pixels within the interleaved kind's
stated error; every batch once on 2 ranks x 2 workers and across a resume onto 3 ranks; tokens
straddling a turn's header and its answer; every kind of bad sample counted by its reason."""

from __future__ import annotations

import collections
import re
import unicodedata

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conversation_corpus import (  # noqa: E402
    BAD_KINDS,
    real_conversation,
    real_conversations,
    write_bad_llava_tar,
    write_llava_tar,
)
from interleaved_batches import batch_digest, check_learned_or_cut, content_digest, labels_by_content  # noqa: E402
from qwen_reference import (  # noqa: E402
    EOS,
    IM_END,
    IMAGE_PAD,
    QWEN2_VL_CHAT_TEMPLATE,
    chat_template,
    conversation_messages,
    decode_image,
    eos_id,
    image_tokens,
    make_chat_processor,
    reference_conversation,
    render_conversation,
    write_chat_tokenizer_json,
    write_tokenizer_json,
)
from shardstream import Conversations, InterleavedCounts, InterleavedLoader, QwenVL, count_interleaved  # noqa: E402

MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 256
SPEC = QwenVL(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
SEQ_LEN, BATCH = 1024, 2
PAD = 2  # "<pad>": never in a conversation, so padding is told apart from runs by its ids
VISION_START, IMAGE_PAD_ID = 1000, 1002  # the vision tokens added to the fixture (tests/qwen_reference.py)
CONVERSATIONS, PER_SHARD = 36, 6


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return write_chat_tokenizer_json(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def processor():
    return make_chat_processor(MIN_PIXELS, MAX_PIXELS)


@pytest.fixture(scope="module")
def convs() -> list[dict]:
    return real_conversations(CONVERSATIONS)


@pytest.fixture(scope="module")
def tars(convs, tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("llava")
    return [
        write_llava_tar(str(root / f"llava-{i:02d}.tar"), convs[i * PER_SHARD : (i + 1) * PER_SHARD])
        for i in range(CONVERSATIONS // PER_SHARD)
    ]


@pytest.fixture(scope="module")
def references(convs, processor) -> dict[str, dict]:
    eos = eos_id(processor)
    return {c["key"]: reference_conversation(processor, c["conversations"], c["images"], eos) for c in convs}


def count(files, tokenizer, conversations=None, **kw) -> InterleavedCounts:
    conversations = conversations if conversations is not None else Conversations()
    settings = {"spec": SPEC, "seq_len": SEQ_LEN, "batch_size": BATCH, "eos_token": EOS, "threads": 2, **kw}
    return count_interleaved(files, tokenizer=tokenizer, layout=conversations, **settings)


@pytest.fixture(scope="module")
def counts(tars, tokenizer) -> InterleavedCounts:
    return count(tars, tokenizer)


def loader(counts, **kw) -> InterleavedLoader:
    return InterleavedLoader(counts, pad_token_id=PAD, threads=kw.pop("threads", 1), **kw)


def documents_of(batches) -> dict[str, dict]:
    """Each conversation put back together from its runs, in the order they were read: its ids,
    labels, the positions where a packed sequence starts, its images' grids and pixel rows."""
    out: dict[str, dict] = collections.defaultdict(
        lambda: {"ids": [], "labels": [], "starts": set(), "grids": [], "pixels": []}
    )
    for b in batches:
        flat, labels = b.input_ids.reshape(-1).tolist(), b.labels.reshape(-1).tolist()
        cu = b.cu_seqlens.tolist()
        runs = [(a, e) for a, e in zip(cu, cu[1:], strict=False) if any(t != PAD for t in flat[a:e])]
        assert len(runs) == len(b.keys), "one key per run, padding apart"
        image, row = 0, 0
        grids = b.image_grid_thw.tolist()
        for (a, e), key in zip(runs, b.keys, strict=True):
            doc = out[key]
            doc["starts"].add(len(doc["ids"]))
            doc["ids"] += flat[a:e]
            doc["labels"] += labels[a:e]
            for t in flat[a:e]:
                if t == VISION_START:
                    n = int(np.prod(grids[image]))
                    doc["grids"].append(grids[image])
                    doc["pixels"].append(b.pixel_values[row : row + n].numpy())
                    image, row = image + 1, row + n
        assert image == len(grids) and row == b.pixel_values.shape[0]
    return out


def expected_labels(ref: dict, mask: list[int]) -> list[int]:
    return [t if m else -100 for t, m in zip(ref["input_ids"], mask, strict=True)]


def label_differences(mine: dict, want: list[int]) -> list[tuple[int, int, int]]:
    """(position, ours, the reference's) where the labels differ, but for a packed sequence's
    first token, which may be -100 where the reference trains it (nothing predicts it)."""
    assert len(mine["labels"]) == len(want)
    return [
        (k, got, ref)
        for k, (got, ref) in enumerate(zip(mine["labels"], want, strict=True))
        if got != ref and not (k in mine["starts"] and got == -100)
    ]


def read_against_reference(convs, tokenizer, processor, tmp_path, **template) -> list[tuple[dict, dict]]:
    """Reads ``convs`` from one tar under ``Conversations(**template)``; checks every one is read
    and that its ids and labels equal the reference's under the same turn pieces; returns (ours,
    the reference's) per conversation."""
    path = write_llava_tar(str(tmp_path / "convs.tar"), convs)
    c = count([path], tokenizer, Conversations(**template))
    assert c.skipped == {} and c.documents == len(convs)
    got = documents_of(loader(c))
    pairs = []
    for conv in convs:
        ref = reference_conversation(
            processor, conv["conversations"], conv["images"], eos_id(processor), **template
        )
        mine = got[conv["key"]]
        assert mine["ids"] == ref["input_ids"], conv["key"]
        diff = label_differences(mine, expected_labels(ref, ref["mask"]))
        assert not diff, (conv["key"], diff[:10])
        pairs.append((mine, ref))
    return pairs


@pytest.mark.parametrize("assistant_only", [True, False])
def test_every_conversation_equals_the_qwen2_vl_chat_template(
    assistant_only, counts, tars, tokenizer, convs, references
):
    """Per conversation (long ones put back together from the rows they were cut across): ids =
    ``apply_chat_template``'s (ChatML, default system turn, each ``<image>`` expanded by the
    processor) + EOS; grids identical; labels = the reference's assistant-token mask applied
    (with ``assistant_only=False``: every text token), a packed sequence's first token apart;
    pixels within the interleaved kind's bounds (mean absolute error per image under 1.5, on
    average under 0.8, 0..255 scale)."""
    c = counts if assistant_only else count(tars, tokenizer, Conversations(assistant_only=False))
    assert c.skipped == {} and c.documents == len(convs)
    got = documents_of(loader(c))
    assert sorted(got) == sorted(conv["key"] for conv in convs)
    vision = {VISION_START, VISION_START + 1, IMAGE_PAD_ID}
    errors = []
    for conv in convs:
        ref, mine = references[conv["key"]], got[conv["key"]]
        assert mine["ids"] == ref["input_ids"], conv["key"]
        assert mine["grids"] == ref["image_grid_thw"].tolist(), conv["key"]
        mask = ref["mask"] if assistant_only else [int(t not in vision) for t in ref["input_ids"]]
        diff = label_differences(mine, expected_labels(ref, mask))
        assert not diff, (conv["key"], diff[:10])
        at = 0
        for grid, pixels in zip(mine["grids"], mine["pixels"], strict=True):
            n = int(np.prod(grid))
            errors.append(float(np.abs(pixels.astype(np.float32) - ref["pixel_values"][at : at + n]).mean()))
            at += n
    assert len(errors) > 40 and max(errors) < 1.5, sorted(errors)[-5:]
    assert np.mean(errors) < 0.8, np.mean(errors)
    assert any(len(d["starts"]) > 1 for d in got.values()), "some conversation is cut across rows"


def test_the_labels_are_the_assistant_answers_and_their_turn_ends(counts, convs, tokenizer):
    """With ``assistant_only``, decoding the labelled tokens of each conversation gives, run by
    run, exactly its assistant answers each followed by ``<|im_end|>``: nothing of a user or
    system turn, a role header, a separator or the EOS is learned."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    got = documents_of(loader(counts))
    whole = 0
    for conv in convs:
        mine = got[conv["key"]]
        labels = mine["labels"]
        assert all(lab in (-100, t) for lab, t in zip(labels, mine["ids"], strict=True))
        assert not {VISION_START, VISION_START + 1, IMAGE_PAD_ID, 1} & set(labels), "no image token nor EOS"
        runs, run = [], []
        for lab in [*labels, -100]:
            if lab != -100:
                run.append(lab)
            elif run:
                runs.append(tok.decode(run, skip_special_tokens=False))
                run = []
        answers = [unicodedata.normalize("NFC", t["value"] + IM_END) for t in conv["conversations"]]
        answers = [a for a, t in zip(answers, conv["conversations"], strict=True) if t["from"] == "gpt"]
        if len(mine["starts"]) == 1:
            assert runs == answers, conv["key"]
            whole += 1
        else:  # a packed sequence's first token may break a run (and a character's bytes) in two
            for text in runs:
                pieces = [p for p in text.split("\ufffd") if p]
                assert all(any(p in a for a in answers) for p in pieces), (conv["key"], text[:200])
    assert whole > len(convs) // 3


@pytest.mark.parametrize(
    "turn_start,answer",
    [
        ("<|im_start|>{role}\n", "\n\n"),
        ("<|im_start|>{role}\n", " "),
        ("<|im_start|>{role}\n", "   "),
        ("<|im_start|>{role} ", ""),  # "ĠY": the header's space and the answer's first letter
        ("<|im_start|>{role} ", "  "),  # "ĠĠ": the header's space and the answer's first
    ],
)
def test_a_token_across_the_header_and_the_answer_follows_the_overlap_rule(
    turn_start, answer, tokenizer, processor, tmp_path
):
    """The answer is tokenized with its header, not alone: whitespace that opens an answer joins
    (or not) the header's last characters as the tokenizer's pre-tokenizer and merges say, and a
    token that overlaps the answer by one character is learned (transformers' rule), one wholly
    in the header is not. Ids and labels equal the reference's under the same turn pieces; where
    the vocabulary merges across the boundary, the test checks that such a token exists."""
    conv = real_conversation(0, seed=11)
    conv["conversations"][1]["value"] = answer + "Yes, " + conv["conversations"][1]["value"]
    mine, ref = read_against_reference([conv], tokenizer, processor, tmp_path, turn_start=turn_start)[0]
    if turn_start.endswith(" "):
        text = ref["text"]  # its image runs expanded, as tokenized
        for grid in ref["image_grid_thw"]:
            text = text.replace(IMAGE_PAD, "\0" * image_tokens(grid), 1)
        text = text.replace("\0", IMAGE_PAD)
        seam = text.index(answer + "Yes, ")
        enc = processor.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        across = [k for k, (a, e) in enumerate(enc["offset_mapping"]) if a < seam < e]
        assert across, "a token straddles the header and the answer"
        k = across[0]
        assert enc["input_ids"][k] == mine["ids"][k] and mine["labels"][k] == mine["ids"][k], "it is learned"


def test_the_reference_template_is_qwen2_vl_s_own(convs, processor):
    """The reference's ChatML template, its generation markers left out, renders every
    conversation as Qwen2-VL's published chat template does, and as the ChatML rule written out in
    Python: the parity above is against Qwen2-VL's rendering, not one of our own."""
    for conv in convs:
        messages = conversation_messages(conv["conversations"], [decode_image(b) for b in conv["images"]])
        official = processor.apply_chat_template(messages, chat_template=QWEN2_VL_CHAT_TEMPLATE)
        ours = processor.apply_chat_template(messages, chat_template=chat_template(generation=False))
        assert ours == official == render_conversation(conv["conversations"]), conv["key"]


def test_no_default_system_turn_and_other_role_names(tokenizer, processor, tmp_path):
    """``system=None`` puts no system turn first (a conversation's own is kept) and ``roles`` maps
    other speaker names; ids and labels still those of the same template in transformers."""
    convs = real_conversations(10, seed=5)
    for conv in convs:
        for turn in conv["conversations"]:
            turn["from"] = {"human": "user", "gpt": "bot"}.get(turn["from"], turn["from"])
    roles = {"user": "user", "bot": "assistant", "system": "system"}
    pairs = read_against_reference(convs, tokenizer, processor, tmp_path, system=None, roles=roles)
    assert not any(ref["text"].startswith("<|im_start|>system\nYou are") for _, ref in pairs)


def test_without_a_turn_separator_the_eos_after_the_last_answer_is_still_not_learned(
    tokenizer, processor, tmp_path
):
    """A template with nothing between turns (``turn_separator=""``, as Llama 3's after
    ``<|eot_id|>``) ends the conversation on the assistant's ``turn_end``: the EOS after it is
    still -100, as in the reference's mask (it once took the learned label of the answer it
    followed)."""
    convs = [c for c in real_conversations(10, seed=9) if c["conversations"][-1]["from"] == "gpt"]
    pairs = read_against_reference(convs, tokenizer, processor, tmp_path, turn_separator="")
    assert pairs and all(mine["labels"][-1] == -100 for mine, _ in pairs)


@pytest.mark.parametrize("kind", sorted(BAD_KINDS))
def test_a_bad_conversation_is_skipped_alone_with_its_reason(kind, tokenizer, tmp_path):
    """Each defect counted under its reason, in the counts and as an example naming the key; the
    four good conversations around it in the same shard are read."""
    path, key = write_bad_llava_tar(str(tmp_path / "bad.tar"), kind, good=2)
    c = count([path], tokenizer)
    reason = BAD_KINDS[kind]
    assert c.skipped == {reason: 1}, c.skipped
    assert c.documents == 4, "its neighbours in the shard are kept"
    examples = [e for u in c.units for e in u["examples"]]
    assert examples[0][0] == key and examples[0][1] == reason
    run = loader(c)
    keys = {k for b in run for k in b.keys}
    assert key not in keys and len(keys) == 4
    if kind == "no_assistant":
        everything = count([path], tokenizer, Conversations(assistant_only=False))
        assert everything.skipped == {} and everything.documents == 5, "it trains on its user turns"


def test_a_turn_end_that_is_not_one_token_is_refused_by_name(tars, tokenizer, tmp_path):
    """A ``turn_end`` the vocabulary lacks as one token would be tokenized as plain text
    silently: refused before reading, naming it; as is a tokenizer without the ChatML tokens."""
    with pytest.raises(ValueError, match=re.escape("<|eot_id|>")):
        count(tars, tokenizer, Conversations(turn_end="<|eot_id|>"))
    with pytest.raises(ValueError, match=re.escape("</turn>")):
        count(tars, tokenizer, Conversations(turn_end="</turn>"))
    plain = write_tokenizer_json(str(tmp_path / "vision-only.json"))
    with pytest.raises(ValueError, match=r"<\|im_(start|end)\|>"):
        count(tars, plain)


def test_exact_on_two_ranks_with_two_workers_deterministic(counts):
    """Every batch read once by 2 ranks x 2 DataLoader workers (the union of their digests is one
    reader's, the remainder apart; a conversation the remainder cuts holds no label), the same
    again on a second pass, reordered by the epoch."""
    whole = [batch_digest(b) for b in loader(counts)]
    assert len(whole) == counts.total_batches == len(set(whole)) >= 6
    labels = labels_by_content(loader(counts))
    per_rank = []
    for rank in range(2):
        per_rank.append([])
        for b in loader(counts, rank=rank, world_size=2).dataloader(2):
            check_learned_or_cut(b, labels)
            per_rank[-1].append(content_digest(b))
    assert len(per_rank[0]) == len(per_rank[1]) == counts.total_batches // 2
    read = per_rank[0] + per_rank[1]
    assert len(read) == len(set(read)), "no batch twice"
    assert len(set(labels) - set(read)) == counts.total_batches % 2
    again = [content_digest(b) for b in loader(counts, rank=1, world_size=2).dataloader(2)]
    assert again == per_rank[1], "deterministic"
    other = loader(counts)
    other.set_epoch(1)
    reordered = [batch_digest(b) for b in other]
    assert sorted(reordered) == sorted(whole), "the epoch reorders the units, the same batches"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_onto_three_ranks_reads_the_rest_of_the_epoch_once(counts, workers):
    """Two ranks read 2 batches each and save; three ranks resume and read the rest: no batch
    twice across the resume, none made up, every rank the same number, the remainder < 3."""
    stop = 2
    whole = labels_by_content(loader(counts))
    consumed, state = [], None
    for rank in range(2):
        ranked = loader(counts, rank=rank, world_size=2)
        source = ranked.dataloader(workers) if workers else ranked
        for step, b in enumerate(source):
            check_learned_or_cut(b, whole)
            consumed.append(content_digest(b))
            if step + 1 == stop:
                break
        state = source.state_dict(stop)
    resumed, lengths, remainder = [], [], 0
    for rank in range(3):
        ranked = loader(counts, rank=rank, world_size=3)
        ranked.load_state_dict(state)
        source = ranked.dataloader(workers) if workers else ranked
        batches = []
        for b in source:
            check_learned_or_cut(b, whole)
            batches.append(content_digest(b))
        lengths.append(len(batches))
        resumed += batches
        remainder = ranked.stats["remainder_batches"]
    assert len(set(lengths)) == 1 and lengths[0] > 0, "every rank the same number of batches"
    everything = consumed + resumed
    assert len(everything) == len(set(everything)), "no batch twice across the resume"
    assert len(whole) - len(everything) == remainder < 3
