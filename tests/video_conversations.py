"""LLaVA-Video conversations for the tests of videos in the interleaved kind
(test_interleaved_video.py, test_vlm_trainer_video.py): the tokenizer fixture with Qwen2-VL's
``<|video_pad|>``, and conversations that name their clips as LLaVA-Video-178K does (a ``video``
or ``videos`` field, ``<video>`` placeholders), of clips FFmpeg's CLI makes from real photos
(tests/video_clips.py) and the real captions and photos of tests/conversation_corpus.py.

A conversation is conversation_corpus's dict (``key``, ``conversations``, ``images``,
``names``), with ``json`` (the video field, merged over the sample's json) and ``members`` (every
member but the json, videos included), so that :func:`conversation_corpus.write_llava_tar`
writes it.
"""

from __future__ import annotations

import random

from conversation_corpus import FOLLOW_UPS, IMAGE, answer
from interleaved_corpus import real_image
from qwen_reference import IM_END, IM_START, IMAGE_PAD, TOKENIZER, VISION_END, VISION_START

VIDEO = "<video>"
VIDEO_PAD = "<|video_pad|>"
VIDEO_QUESTIONS = (
    "What happens in the clip?",
    "Describe the video.",
    "What does the camera show?",
    "Write a caption for this clip.",
)


def write_tokenizer(path: str) -> str:
    """The GPT-2-style fixture with Qwen2-VL's vision tokens, ChatML's and ``<|video_pad|>`` as
    special tokens, in that order (ids 1000 to 1005)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(TOKENIZER)
    added = (VISION_START, VISION_END, IMAGE_PAD, IM_START, IM_END, VIDEO_PAD)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in added])
    tok.save(path)
    return path


#: The ways :func:`video_conversation` names its videos, by ``i % 4``.
VIDEO_CASES = (
    "one video named by its original LLaVA-Video path (no such member): the sample's one video",
    "one video named by its member's extension",
    "two videos as videos: [0.EXT, 1.EXT], both placeholders in the first turn",
    "a photo (image: jpg) and a video in the same turn",
)


def video_conversation(i: int, clips: dict[str, bytes], seed: int = 0) -> dict:
    """Conversation ``i`` of ``seed`` over ``clips`` (name -> the clip's bytes, each name ending
    in its container's extension, e.g. ``"pan.mp4"``): a case of :data:`VIDEO_CASES`, one to
    three rounds of real captions as answers."""
    rng = random.Random(f"video-conversation:{seed}:{i}")
    key = f"video-s{seed}-{i:05d}"
    names = sorted(clips)
    first = rng.choice(names)
    ext = first.rsplit(".", 1)[1]
    case = i % 4
    conv: dict = {"key": key, "images": [], "names": None}
    if case == 0:
        conv["json"] = {"video": f"llava-video/{rng.randrange(10**6):06d}.{ext}"}
        conv["members"] = [(ext, clips[first])]
        lead = VIDEO + "\n"
    elif case == 1:
        conv["json"] = {"video": ext}
        conv["members"] = [(ext, clips[first])]
        lead = VIDEO + "\n"
    elif case == 2:
        second = rng.choice([n for n in names if n != first])
        members = [f"0.{ext}", f"1.{second.rsplit('.', 1)[1]}"]
        conv["json"] = {"videos": members}
        conv["members"] = [(members[0], clips[first]), (members[1], clips[second])]
        lead = VIDEO + " " + VIDEO + " "
    else:
        photo = real_image(rng, "small")
        conv.update(images=[photo], names="jpg", json={"video": ext})
        conv["members"] = [("jpg", photo), (ext, clips[first])]
        lead = f"A photo {IMAGE} and a clip {VIDEO}. "
    turns = []
    for r in range(rng.randint(1, 3)):
        q = rng.choice(VIDEO_QUESTIONS) if r == 0 else rng.choice(FOLLOW_UPS)
        turns.append({"from": "human", "value": (lead if r == 0 else "") + q})
        turns.append({"from": "gpt", "value": answer(rng)})
    conv["conversations"] = turns
    return conv


def video_conversations(n: int, clips: dict[str, bytes], seed: int = 0) -> list[dict]:
    """``n`` conversations of :func:`video_conversation`, deterministic for ``seed``."""
    return [video_conversation(i, clips, seed) for i in range(n)]
