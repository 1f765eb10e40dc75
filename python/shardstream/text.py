"""Tokenizer resolution for ``ShardLoader(tokenizer=...)``: the Rust pipeline tokenizes.

``tokenizer`` is an open_clip model name (``"ViT-B-32"``: open_clip's CLIP BPE vocabulary file,
shipped inside the open_clip package, and the model's context length) or the path of a Hugging
Face ``tokenizer.json`` (CLIP BPE; context length 77). Nothing is downloaded.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT_CONTEXT_LENGTH = 77


def resolve_tokenizer(tokenizer: str) -> tuple[str, str, int]:
    """(kind, path, context_length) for the Rust tokenizer: kind "bpe" or "json"."""
    if tokenizer.endswith(".json") or os.path.isfile(tokenizer):
        if not os.path.isfile(tokenizer):
            raise FileNotFoundError(f"tokenizer file {tokenizer!r} does not exist")
        return "json", tokenizer, DEFAULT_CONTEXT_LENGTH
    try:
        import open_clip
        from open_clip.tokenizer import SimpleTokenizer, default_bpe
    except ImportError as e:
        raise ImportError(
            f"tokenizer={tokenizer!r} names an open_clip model: install open_clip_torch "
            "(or pass a tokenizer.json path)"
        ) from e
    tok = open_clip.get_tokenizer(tokenizer)
    if type(tok) is not SimpleTokenizer or getattr(tok, "reduction_fn", None) is not None:
        raise ValueError(
            f"open_clip model {tokenizer!r} uses {type(tok).__name__}, not the CLIP BPE tokenizer "
            "the Rust pipeline reproduces; pass a tokenizer.json path or tokenize in Python"
        )
    if tok.clean_fn.__name__ != "_clean_lower":
        raise ValueError(f"open_clip model {tokenizer!r} cleans with {tok.clean_fn.__name__}, not 'lower'")
    return "bpe", default_bpe(), int(tok.context_length)


def rust_tokenizer(tokenizer: str) -> Any:
    """The Rust tokenizer on its own (``_core.ClipTokenizer``), as the loader would build it."""
    from shardstream import _core

    return _core.ClipTokenizer(*resolve_tokenizer(tokenizer))
