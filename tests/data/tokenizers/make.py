"""Writes the tokenizer.json fixtures of tests/test_tokenizer_json.py with the Hugging Face
`tokenizers` package, and that package's own encoding of the 1,000 real captions.

    pip install tokenizers && python tests/data/tokenizers/make.py

* captions-bpe.json: a byte-level BPE (GPT-2 style: NFC, ByteLevel pre-tokenizer with a prefix
  space, `<s> $A </s>`), vocabulary 1,000, trained on the real captions.
* captions-wordpiece.json: a WordPiece (BERT style: BertNormalizer lowercasing, BertPreTokenizer,
  `[CLS] $A [SEP]`), vocabulary 1,000, trained on the same captions.
* llama3-style-bpe.json (made apart, not by this script): a byte-level BPE with Llama 3's split
  pattern (the Rust fast-BPE tests' fixture), vocabulary 4,000, written by
  ``tests/text_corpus.llama3_style_tokenizer(path, text_corpus.documents(), vocab=4000)``.
* reference.npz: for each, `tokenizers`' encoding of every caption as the loader yields it
  (``batch.texts``: stripped of surrounding whitespace), with ``enable_truncation(77)``, then
  padded with 0 to 77 (what ``ShardLoader(tokenizer=path)`` promises), int32 [1000, 77]; plus the
  package version and the SHA-256 of the parquet's captions.

`clip_tokenizer_json` builds the third kind, CLIP's own layout (transformers' CLIPTokenizerFast
file) from open_clip's vocabulary; at 3.6 MB it is made by the test in a temporary folder, not
kept here.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CONTEXT = 77
NAMES = ("captions-bpe.json", "captions-wordpiece.json")


def captions() -> list[str]:
    sys.path.insert(0, os.path.join(HERE, "..", ".."))
    import pyarrow.parquet as pq
    from servers import CAPTIONS_PARQUET

    return [t or "" for t in pq.read_table(CAPTIONS_PARQUET, columns=["TEXT"]).column("TEXT").to_pylist()]


def captions_sha256(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode("utf-8", "surrogatepass")).hexdigest()


def reference_ids(path: str, texts: list[str], context: int = CONTEXT) -> np.ndarray:
    """`tokenizers`' encoding of ``texts`` as the loader promises it: truncated to ``context``
    by the library (its special tokens kept), then padded with 0."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.enable_truncation(max_length=context)
    tok.no_padding()
    out = np.zeros((len(texts), context), dtype=np.int64)
    for i, enc in enumerate(tok.encode_batch(texts)):
        out[i, : len(enc.ids)] = enc.ids
    return out


def clip_tokenizer_json(path: str) -> str:
    """CLIP's tokenizer.json as transformers writes it for CLIPTokenizerFast (NFC, whitespace
    runs to one space, lowercase; CLIP's split regex, then byte-level; BPE with `</w>`;
    `<|startoftext|> $A <|endoftext|>`), from the vocabulary file open_clip ships."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(line.split()) for line in lines]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    model = models.BPE(
        vocab={v: i for i, v in enumerate(vocab)},
        merges=merges,
        continuing_subword_prefix="",
        end_of_word_suffix="</w>",
        unk_token="<|endoftext|>",
        fuse_unk=False,
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"),
                behavior="removed",
                invert=True,
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    eot, sot = len(vocab) - 1, len(vocab) - 2
    tok.post_processor = processors.RobertaProcessing(
        ("<|endoftext|>", eot), ("<|startoftext|>", sot), trim_offsets=False, add_prefix_space=False
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    tok.save(path)
    return path


def main() -> None:
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    texts = captions()
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=1000,
            special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", bpe.token_to_id("<s>")), ("</s>", bpe.token_to_id("</s>"))],
    )
    bpe.save(os.path.join(HERE, NAMES[0]))

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(
            vocab_size=1000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], show_progress=False
        ),
    )
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", wp.token_to_id("[CLS]")), ("[SEP]", wp.token_to_id("[SEP]"))],
    )
    wp.save(os.path.join(HERE, NAMES[1]))

    stripped = [t.strip() for t in texts]
    arrays = {name: reference_ids(os.path.join(HERE, name), stripped).astype(np.int32) for name in NAMES}
    np.savez_compressed(
        os.path.join(HERE, "reference.npz"),
        version=np.array(tokenizers.__version__),
        captions_sha256=np.array(captions_sha256(texts)),
        **{name.removesuffix(".json"): ids for name, ids in arrays.items()},
    )
    print(f"wrote {', '.join(NAMES)} and reference.npz with tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
