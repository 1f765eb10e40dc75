"""Multi-image conversations (LLaVA layout) for the interleaved kind: how a conversation in a
WebDataset tar is rendered into tokens, and which of them the model learns.

A sample is ``KEY.json`` holding ``conversations``, a list of ``{"from": ..., "value": ...}``
turns whose ``<image>`` placeholders stand for the sample's images, and ``image`` (one name) or
``images`` (a list of names); each name is a member of the sample by its extension (``"jpg"``
for ``KEY.jpg``, ``"0.jpg"`` for ``KEY.0.jpg``). A single ``image`` that names no member (LLaVA
keeps the original path, ``"coco/train2017/....jpg"``) is the sample's one image member.
Videos are named the same way by ``video`` (one) or ``videos`` (a list), LLaVA-Video-178K's
layout, each standing for a ``<video>`` placeholder: ``"mp4"`` for ``KEY.mp4``; a single
``video`` that names no member is the sample's one video member (``mp4``, ``webm``, ``mkv``,
``mov``). Videos need a :class:`~shardstream.QwenVideo` rule on the vision spec.

In Parquet (LLaVA-OneVision-Data, the Cauldron), the turns are a ``list<struct<from, value>>``
column named by ``field`` (or the Cauldron's ``list<struct<user, assistant, source>>``) beside
an ``image`` column (one ``datasets`` Image struct or binary) or an ``images`` list of them, and
a ``video`` or ``videos`` column likewise.

The rendering and its labels are described once, on :class:`Conversations`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from shardstream.errors import OptionError

#: LLaVA's and ShareGPT's names for the speakers, and the roles Qwen2-VL's template writes.
DEFAULT_ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Conversations:
    """Reads LLaVA-style conversations instead of interleaved documents, for
    :func:`~shardstream.count_interleaved`'s ``layout=``: from tars (``KEY.json``), or from
    Parquet, where ``field`` names a ``list<struct<from: string, value: string>>`` column
    (LLaVA-OneVision-Data's ``conversations``) or a ``list<struct<user: string, assistant:
    string>>`` one (the Cauldron's ``texts``: each item a user turn, then an assistant turn;
    when no turn holds a ``placeholder``, the row's images lead its first user turn), beside an
    ``images`` column (a list of ``datasets`` Image structs or binary) or an ``image`` column
    (one; null for none), and likewise a ``videos`` or ``video`` column (``datasets`` Video
    structs or binary). A row is rendered, labelled and checked as a tar's sample is.

    A conversation is rendered as a chat template renders string contents (the defaults are
    ChatML, as Qwen2-VL's and Qwen2.5-VL's templates): when ``system`` is set and the first turn
    is not a system turn, ``turn_start`` (role ``system``) + ``system`` + ``turn_end`` +
    ``turn_separator`` first; then for each turn ``turn_start`` (``{role}`` replaced by
    ``roles[turn["from"]]``) + its ``value`` + ``turn_end`` + ``turn_separator``. Each
    ``placeholder`` in a value becomes the next image, as the vision spec writes it (for
    :class:`~shardstream.QwenVL`: ``<|vision_start|>``, its ``<|image_pad|>`` run,
    ``<|vision_end|>``, as Qwen2-VL fine-tuning code replaces ``<image>``); each
    ``video_placeholder`` becomes the next video (``<|vision_start|>``, its ``<|video_pad|>``
    run, ``<|vision_end|>``, as Qwen2-VL's chat template writes a video). The EOS follows the
    conversation, as it follows every document.

    Labels, with ``assistant_only``: a token is learned when it overlaps an assistant turn's
    value or the ``turn_end`` closing it, the rule of transformers'
    ``return_assistant_tokens_mask`` with a ``{% generation %}`` block around them. Role
    headers, the system and user turns, separators, the EOS after the conversation, image
    tokens and padding are -100. Without ``assistant_only``, every text token is learned.

    A sample is skipped, counted by reason, when its placeholders and images (or video
    placeholders and videos) differ in number (``misaligned_document``), it names a member it lacks
    (``missing_image``, ``missing_video``), a turn has no
    string ``from`` and ``value`` or an unknown ``from``, or there is no ``field`` list
    (``bad_json``), or, with ``assistant_only``, it has no assistant turn and would teach nothing
    (``missing_text``).

    Attributes:
        field: The JSON field (tar) or the column (Parquet) holding the turns.
        placeholder: What stands for an image in a turn's value.
        video_placeholder: What stands for a video in a turn's value (LLaVA-Video's).
        system: The system turn put first when a conversation has none; None: none.
        turn_start: Opens a turn; ``{role}`` is replaced by the turn's role.
        turn_end: Closes a turn; learned with an assistant turn. It must be one token of the
            tokenizer's vocabulary (a special token): a template whose end is not one token
            would be tokenized as plain text without anyone noticing.
        turn_separator: Between a turn's end and the next turn; never learned.
        roles: A turn's ``from`` -> the role written in ``turn_start``; one must map to
            ``"assistant"``.
        assistant_only: Learn only the assistant turns (else every text token).
    """

    field: str = "conversations"
    placeholder: str = "<image>"
    video_placeholder: str = "<video>"
    system: str | None = "You are a helpful assistant."
    turn_start: str = "<|im_start|>{role}\n"
    turn_end: str = "<|im_end|>"
    turn_separator: str = "\n"
    # `dataclasses.field` by its module: the attribute `field` above shadows the name here.
    roles: dict[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_ROLES))
    assistant_only: bool = True

    def __post_init__(self) -> None:
        for name in ("field", "placeholder", "video_placeholder", "turn_start", "turn_end", "turn_separator"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"conversations.{name}", f"must be a string, not {getattr(self, name)!r}")
        if not self.placeholder:
            raise OptionError("conversations.placeholder", "must not be empty")
        if not self.video_placeholder:
            raise OptionError("conversations.video_placeholder", "must not be empty")
        if self.placeholder in self.video_placeholder or self.video_placeholder in self.placeholder:
            raise OptionError(
                "conversations.video_placeholder",
                f"{self.video_placeholder!r} and placeholder {self.placeholder!r} must not hold one another",
            )
        if "assistant" not in self.roles.values():
            raise OptionError("conversations.roles", f"no speaker maps to 'assistant': {self.roles!r}")

    def settings(self) -> dict[str, Any]:
        """Its fields as the counts record them (and the core reads them)."""
        return {"kind": "conversations", **asdict(self)}
