"""Packed rows train as if each document were alone: a tiny ``Qwen2VLForConditionalGeneration``
(random weights, float32, sdpa, nothing downloaded) fed ``InterleavedLoader`` batches through
``QwenVLCollator`` gives, for every document run in a packed row, the logits of that run fed
alone (its ids, its images, the positions the model computes for it), within 1e-4 over every
position of the run. Checked for OBELICS-style documents of real photos and captions (with runs
continued from the previous row), LLaVA conversations, caption pairs and a three-source
``VlmMixture`` with text-only documents; and the batch's positions are the model's own
``get_rope_index`` of each run alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conversation_corpus import real_conversations, write_llava_tar  # noqa: E402
from interleaved_corpus import captions, real_documents, write_caption_tar, write_obelics_parquet  # noqa: E402
from qwen_reference import EOS, tiny_qwen2_vl_config, write_chat_tokenizer_json, write_tokenizer_json  # noqa: E402
from shardstream import (  # noqa: E402
    Captions,
    Conversations,
    InterleavedLoader,
    QwenVL,
    QwenVLCollator,
    VlmMixture,
    VlmSource,
    count_interleaved,
    count_tokens,
    vlm_rows,
)
from text_corpus import write_parquet_corpus  # noqa: E402

SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
PAD = 2  # "<pad>" of the tokenizer fixture: never in a document
TOLERANCE = 1e-4


def tiny_qwen2_vl(vocab: int, vision_ids: tuple[int, int, int]):
    """Two decoder layers (so a leak through the first reaches the second), in float32 on sdpa."""
    config = tiny_qwen2_vl_config(vocab, vision_ids, layers=2, pad_id=PAD)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    return model.eval()


def model_for(loader) -> object:
    import tokenizers

    vocab = tokenizers.Tokenizer.from_file(loader_counts(loader).tokenizer).get_vocab_size()
    return tiny_qwen2_vl(vocab, vision_ids(loader))


def loader_counts(loader):
    return loader.counts if isinstance(loader, InterleavedLoader) else loader.loaders[0].counts


def vision_ids(loader) -> tuple[int, int, int]:
    first = loader if isinstance(loader, InterleavedLoader) else loader.loaders[0]
    return first.vision_token_ids


def runs_of(batch) -> list[tuple[int, int, int, str]]:
    """(row, start, end, key) of each document run, padding apart; runs of a text source of a
    mixture (no key) get the key ``None``."""
    seq_len = batch.input_ids.shape[1]
    cu = batch.cu_seqlens.tolist()
    flat = batch.input_ids.reshape(-1)
    keys = iter(batch.keys)
    out = []
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        if bool((flat[a:e] == PAD).all()):
            continue
        row = a // seq_len
        assert e <= (row + 1) * seq_len, "a sequence stays in its row"
        # Rows of a mixture's text source hold no images and no keys.
        key = next(keys, None) if row < len(batch.input_ids) - text_rows(batch) else None
        out.append((row, a - row * seq_len, e - row * seq_len, key))
    assert next(keys, None) is None, "one key per image-text run"
    return out


def text_rows(batch) -> int:
    return getattr(batch, "_text_rows", 0)


def check_isolated(loader, *, batches: int | None = None) -> dict[str, int]:
    """Runs each packed batch and each of its runs alone; returns what was compared."""
    model = model_for(loader)
    start_id = vision_ids(loader)[0]
    collate = QwenVLCollator()
    seen: set[str] = set()
    positions = []
    compared = {"runs": 0, "rows_with_several": 0, "continued": 0, "images": 0, "text_only": 0, "tokens": 0}
    for n, batch in enumerate(loader):
        if batches is not None and n == batches:
            break
        inputs = collate(batch)
        inputs.pop("labels")
        with torch.no_grad():
            packed = model(**inputs).logits
        grids = inputs.get("image_grid_thw", torch.zeros((0, 3), dtype=torch.int64))
        image, row_at = 0, 0
        runs, runs_positions = runs_of(batch), []
        per_row = [r for r, *_ in runs]
        compared["rows_with_several"] += sum(per_row.count(r) > 1 for r in set(per_row))
        for row, a, e, key in runs:
            ids = batch.input_ids[row, a:e]
            k = int((ids == start_id).sum())
            alone = {
                "input_ids": ids[None],
                "mm_token_type_ids": (ids == model.config.image_token_id).int()[None],
            }
            if k:
                g = grids[image : image + k]
                rows = int(g.prod(-1).sum())
                alone["pixel_values"] = inputs["pixel_values"][row_at : row_at + rows]
                alone["image_grid_thw"] = g
                image, row_at = image + k, row_at + rows
            with torch.no_grad():
                want = model(**alone).logits[0]
                # The batch's positions are the model's own for the run alone.
                if k:
                    rope, _ = model.model.get_rope_index(
                        ids[None], alone["mm_token_type_ids"], alone["image_grid_thw"]
                    )
                else:
                    rope = torch.arange(e - a).view(1, 1, -1).expand(3, 1, -1)
            diff = float((packed[row, a:e] - want).abs().max())
            assert diff < TOLERANCE, (key, row, a, e, diff)
            runs_positions.append((row, a, e, key, rope[:, 0]))
            compared["runs"] += 1
            compared["images"] += k
            compared["tokens"] += e - a
            compared["text_only"] += key is None
            if key is not None:
                compared["continued"] += key in seen
                seen.add(key)
        assert image == len(grids)
        positions.append((inputs.get("position_ids"), batch, runs_positions))
    # The logits first (the contract), then how: the batch's positions are the model's own.
    for given, batch, runs_positions in positions:
        for row, a, e, key, rope in runs_positions:
            got = given[:, row, a:e]
            assert got[0].tolist() == list(range(e - a)), (key, "text positions restart at the run")
            assert torch.equal(got[1:], rope), (key, "M-RoPE positions as the run alone")
            assert torch.equal(batch.packed_position_ids[:, row, a:e], got)
    return compared


def test_documents_with_runs_continued_from_the_previous_row(tmp_path):
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    path = write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(10, seed=11), 5)
    counts = count_interleaved(
        [path], tokenizer=tokenizer, spec=SPEC, seq_len=256, batch_size=2, eos_token=EOS, threads=1
    )
    seen = check_isolated(InterleavedLoader(counts, pad_token_id=PAD, threads=1))
    assert seen["runs"] > 10 and seen["images"] > 5, seen
    assert seen["rows_with_several"] > 0 and seen["continued"] > 0, seen


def test_conversations(tmp_path):
    tokenizer = write_chat_tokenizer_json(str(tmp_path / "tokenizer.json"))
    tar = write_llava_tar(str(tmp_path / "llava.tar"), real_conversations(8, seed=3))
    counts = count_interleaved(
        [tar], tokenizer=tokenizer, spec=SPEC, seq_len=512, batch_size=2, eos_token=EOS,
        layout=Conversations(), threads=1,
    )  # fmt: skip
    seen = check_isolated(InterleavedLoader(counts, pad_token_id=PAD, threads=1))
    assert seen["rows_with_several"] > 0 and seen["images"] > 0, seen


def test_caption_pairs(tmp_path):
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    tar = write_caption_tar(str(tmp_path / "pairs.tar"), 12, seed=2)
    counts = count_interleaved(
        [tar], tokenizer=tokenizer, spec=SPEC, seq_len=256, batch_size=2, eos_token=EOS,
        layout=Captions(), threads=1,
    )  # fmt: skip
    seen = check_isolated(InterleavedLoader(counts, pad_token_id=PAD, threads=1))
    assert seen["rows_with_several"] > 0 and seen["images"] == 12, seen


def test_a_mixture_of_documents_caption_pairs_and_text(tmp_path):
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    weights, batch_size, seq_len = (0.5, 0.25, 0.25), 4, 256
    rows = vlm_rows(weights, batch_size)
    common = {"tokenizer": tokenizer, "spec": SPEC, "seq_len": seq_len, "eos_token": EOS, "threads": 1}
    docs = write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(8, seed=12), 4)
    pairs = write_caption_tar(str(tmp_path / "pairs.tar"), 12, seed=4)
    texts = [" ".join(captions()[i : i + 3]) for i in range(0, 120, 3)]
    sources = [
        VlmSource(count_interleaved([docs], batch_size=rows[0], **common), weights[0], "docs"),
        VlmSource(
            count_interleaved([pairs], batch_size=rows[1], layout=Captions(), **common), weights[1], "pairs"
        ),
        VlmSource(
            count_tokens(write_parquet_corpus(str(tmp_path / "text"), texts, files=1), tokenizer=tokenizer),
            weights[2],
            "text",
        ),
    ]
    mixture = VlmMixture(sources, batch_size=batch_size, seed=1, pad_token_id=PAD, threads=1)

    class Marked:
        """The mixture's batches, each told how many of its last rows are the text source's."""

        loaders = mixture.loaders

        def __iter__(self):
            for b in mixture:
                b._text_rows = rows[2]
                yield b

    seen = check_isolated(Marked(), batches=3)
    assert seen["text_only"] > 0 and seen["images"] > 0 and seen["rows_with_several"] > 0, seen


def test_without_the_positions_documents_leak(tmp_path):
    """The control: the same rows without ``position_ids`` (the model positions each row as one
    sequence, as the collator did before) give other logits for a document after the first."""
    tokenizer = write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    path = write_obelics_parquet(str(tmp_path / "docs.parquet"), real_documents(6, seed=13), 3)
    counts = count_interleaved(
        [path], tokenizer=tokenizer, spec=SPEC, seq_len=512, batch_size=1, eos_token=EOS, threads=1
    )
    loader = InterleavedLoader(counts, pad_token_id=PAD, threads=1)
    model = model_for(loader)
    worst = 0.0
    for batch in loader:
        inputs = QwenVLCollator()(batch)
        inputs.pop("labels")
        with torch.no_grad():
            isolated = model(**inputs).logits
            inputs.pop("position_ids")
            whole = model(**inputs).logits
        for row, a, e, _ in runs_of(batch)[1:]:
            if a > 0:
                worst = max(worst, float((isolated[row, a:e] - whole[row, a:e]).abs().max()))
    assert worst > 100 * TOLERANCE, worst
