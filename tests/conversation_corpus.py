"""LLaVA-style multi-image conversations for the interleaved kind's conversation tests, built from
real data only: the photos of tests/interleaved_corpus.py (scikit-image, scikit-learn and
matplotlib wheels, cut to its size classes) and the real web captions of img2dataset's test
parquet. Questions are templated ("<image>\\nDescribe the picture."); answers are real captions or
paragraphs of them.

A conversation is ``{"key": str, "conversations": [{"from": ..., "value": ...}, ...], "images":
[bytes, ...], "names": str | list[str] | None}``: ``images`` in the order their ``<image>``
placeholders appear over the whole conversation; ``names`` is how the sample's json names them:
a string is LLaVA's single ``"image"`` entry (an original file path such as
``"coco/train2017/000000033471.jpg"``, naming no member, or ``"jpg"``), written with one member
``KEY.jpg``; a list is the ``"images"`` entry (``["0.jpg", "1.jpg"]``), one member ``KEY.<name>``
per image; None: no image entry (a text-only conversation).

Conversation ``i`` of a seed is drawn from its own generator, seeded by ``(seed, i)``, so
``real_conversations(3)`` is a prefix of ``real_conversations(40)``. Conversations 0-9 are the
fixed cases of :data:`FIXED_CASES`.
"""

from __future__ import annotations

import json
import random
import tarfile

from interleaved_corpus import _add, captions, real_image, real_text

IMAGE = "<image>"
QUESTIONS = (
    "Describe the picture.",
    "What is shown in this image?",
    "What do you see here?",
    "Write a caption for this photo.",
    "Give a short title for the image.",
    "What is in the picture? Answer briefly.",
)
FOLLOW_UPS = ("Tell me more.", "Can you say it in other words?", "What else?", "Is there anything else?")
#: Conversations 0-9 (see :func:`real_conversation`).
FIXED_CASES = (
    "one image named by its original LLaVA path (no such member), member KEY.jpg",
    "three images as images: [0.jpg, 1.jpg, 2.jpg], placeholders in turns 0, 2 and 4",
    "its own system turn, one image named 'jpg'",
    "text only (no image entry)",
    "eight turns of long caption paragraphs: longer than a row",
    "an answer that begins with two newlines",
    "an answer that begins with a space, another with three",
    "a placeholder at the very end of a user turn and one in the middle of its text",
    "four images, two of them side by side in one turn",
    "two images in the last user turn only",
)


def conversation_key(seed: int, i: int) -> str:
    """Keys carry no dot (a WebDataset key ends at the first dot of a member's name)."""
    return f"conv-s{seed}-{i:05d}"


def question(rng: random.Random) -> str:
    return rng.choice(QUESTIONS)


def answer(rng: random.Random, long: bool = False) -> str:
    """A real caption or a paragraph of them (``long``: 25-40 captions)."""
    if not long:
        return real_text(rng)
    caps = captions()
    start = rng.randrange(len(caps))
    return ". ".join(caps[(start + j) % len(caps)] for j in range(rng.randint(25, 40)))


def with_images(text: str, n: int, where: str, rng: random.Random) -> str:
    """``text`` with ``n`` placeholders: at the start (LLaVA's ``"<image>\\n..."``), at the very
    end, or in the middle of the text (between two of its words)."""
    marks = IMAGE * n
    if where == "start":
        return marks + "\n" + text
    if where == "end":
        return text + " " + marks
    words = text.split(" ")
    if len(words) < 2:
        return text + " " + marks + " " + rng.choice(QUESTIONS)
    cut = rng.randint(1, len(words) - 1)
    return " ".join(words[:cut]) + " " + marks + " " + " ".join(words[cut:])


def _dialogue(rng: random.Random, rounds: int, images_at: dict[int, tuple[int, str]], long: bool = False):
    """``rounds`` human/gpt pairs; ``images_at`` maps a round to (placeholders, where)."""
    turns = []
    for r in range(rounds):
        q = question(rng) if r == 0 or rng.random() < 0.5 else rng.choice(FOLLOW_UPS)
        if r in images_at:
            n, where = images_at[r]
            q = with_images(q, n, where, rng)
        turns.append({"from": "human", "value": q})
        turns.append({"from": "gpt", "value": answer(rng, long)})
    return turns


def _photos(rng: random.Random, n: int) -> list[bytes]:
    return [
        real_image(rng, rng.choice(["tiny", "small", "small", "medium", "medium", "tie", "large"]))
        for _ in range(n)
    ]


def real_conversation(i: int, seed: int = 0) -> dict:
    """Conversation ``i`` of ``seed`` (see the module's docstring and :data:`FIXED_CASES`)."""
    rng = random.Random(f"conversation:{seed}:{i}")
    key = conversation_key(seed, i)
    names: str | list[str] | None
    if i == 0:
        turns = _dialogue(rng, rng.randint(1, 3), {0: (1, "start")})
        names = f"coco/train2017/{rng.randrange(10**6):012d}.jpg"
    elif i == 1:
        turns = _dialogue(rng, 3, {0: (1, "start"), 1: (1, "middle"), 2: (1, "end")})
        names = ["0.jpg", "1.jpg", "2.jpg"]
    elif i == 2:
        system = {"from": "system", "value": "You describe photos in one line. " + rng.choice(captions())}
        turns = [system, *_dialogue(rng, 2, {0: (1, "start")})]
        names = "jpg"
    elif i == 3:
        turns, names = _dialogue(rng, rng.randint(1, 4), {}), None
    elif i == 4:
        turns = _dialogue(rng, 4, {0: (1, "start"), 2: (1, "end")}, long=True)
        names = ["0.jpg", "1.jpg"]
    elif i in (5, 6):
        turns = _dialogue(rng, 2, {0: (1, "start")})
        turns[1]["value"] = ("\n\n" if i == 5 else " ") + turns[1]["value"]
        turns[3]["value"] = ("\n\n" if i == 5 else "   ") + turns[3]["value"]
        names = "jpg"
    elif i == 7:
        turns = _dialogue(rng, 2, {0: (1, "end"), 1: (1, "middle")})
        names = ["0.jpg", "1.jpg"]
    elif i == 8:
        turns = _dialogue(rng, 3, {0: (2, "start"), 1: (1, "middle"), 2: (1, "end")})
        names = ["0.jpg", "1.jpg", "2.jpg", "3.jpg"]
    elif i == 9:
        turns = _dialogue(rng, 3, {2: (2, "start")})
        names = ["0.jpg", "1.jpg"]
    else:
        n = rng.choice([0, 1, 1, 1, 2, 2, 3, 4])
        rounds = rng.randint(max(1, (n + 1) // 2), 4)
        images_at: dict[int, tuple[int, str]] = {}
        for _ in range(n):
            r = 0 if not images_at and rng.random() < 0.6 else rng.randrange(rounds)
            count, where = images_at.get(r, (0, rng.choice(["start", "start", "end", "middle"])))
            images_at[r] = (count + 1, where)
        turns = _dialogue(rng, rounds, images_at)
        if n == 0:
            names = None
        elif n == 1 and rng.random() < 0.5:
            names = rng.choice(["jpg", f"coco/train2017/{rng.randrange(10**6):012d}.jpg"])
        else:
            names = [f"{j}.jpg" for j in range(n)]
    n = sum(t["value"].count(IMAGE) for t in turns)
    images = _photos(rng, n)
    return {"key": key, "conversations": turns, "images": images, "names": names}


def real_conversations(n: int, seed: int = 0) -> list[dict]:
    """``n`` conversations of real captions and photos, deterministic for ``seed`` (fresh dicts
    on every call)."""
    return [real_conversation(i, seed) for i in range(n)]


# -- writer ------------------------------------------------------------------------------------------


def llava_members(conv: dict) -> list[tuple[str, bytes]]:
    """The tar members of one conversation: ``KEY.json`` (``{"id", "image" or "images",
    "conversations"}``, plus any ``"json"`` dict of the conversation merged over it), then the
    images: ``KEY.jpg`` for a single ``"image"`` entry, ``KEY.<name>`` per ``"images"`` entry;
    ``conv["members"]``, if given, replaces the image members (a list of (extension, bytes))."""
    key, names = conv["key"], conv.get("names")
    meta: dict = {"id": key}
    if isinstance(names, str):
        meta["image"] = names
        members = [("jpg", conv["images"][0])] if conv["images"] else []
    elif names is not None:
        meta["images"] = list(names)
        members = list(zip(names, conv["images"], strict=False))
    else:
        members = []
    if "conversations" in conv:
        meta["conversations"] = conv["conversations"]
    meta.update(conv.get("json", {}))
    members = conv.get("members", members)
    return [(f"{key}.json", json.dumps(meta, ensure_ascii=False).encode())] + [
        (f"{key}.{ext}", bytes(data)) for ext, data in members
    ]


def write_llava_tar(path: str, conversations: list[dict]) -> str:
    """A WebDataset tar of the conversations (see :func:`llava_members`), fixed mtime/uid/gid, in
    their order. Returns ``path``."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for conv in conversations:
            for name, data in llava_members(conv):
                _add(tar, name, data)
    return path


# -- bad inputs --------------------------------------------------------------------------------------

#: The defects of :func:`bad_conversation`, each with the reason the loader counts it under.
BAD_KINDS = {
    "more_placeholders": "misaligned_document",  # two <image> placeholders, one image
    "fewer_placeholders": "misaligned_document",  # no placeholder, one image
    "missing_member": "missing_image",  # images: [0.jpg, 1.jpg], the tar holds KEY.0.jpg only
    "unknown_role": "bad_json",  # a turn from "robot"
    "value_not_string": "bad_json",  # a turn whose value is a number
    "from_missing": "bad_json",  # a turn without "from"
    "no_conversations": "bad_json",  # the json has no conversations list
    "conversations_not_list": "bad_json",  # conversations is a string
    "no_assistant": "missing_text",  # human turns only (nothing to train on when assistant_only)
}


def bad_conversation(kind: str, seed: int = 0) -> dict:
    """A conversation with the defect ``kind`` (one of :data:`BAD_KINDS`), of real captions and
    photos otherwise; its key is ``bad-<kind>``."""
    rng = random.Random(f"bad-conversation:{kind}:{seed}")
    key = "bad-" + kind.replace("_", "-")
    photo = real_image(rng, "small")
    turns = [
        {"from": "human", "value": IMAGE + "\n" + question(rng)},
        {"from": "gpt", "value": rng.choice(captions())},
    ]
    conv = {"key": key, "conversations": turns, "images": [photo], "names": "jpg"}
    if kind == "more_placeholders":
        turns.append({"from": "human", "value": IMAGE + " " + rng.choice(FOLLOW_UPS)})
        turns.append({"from": "gpt", "value": rng.choice(captions())})
    elif kind == "fewer_placeholders":
        turns[0]["value"] = question(rng)
    elif kind == "missing_member":
        turns[2:] = [{"from": "human", "value": IMAGE}, {"from": "gpt", "value": rng.choice(captions())}]
        conv.update(images=[photo, real_image(rng, "small")], names=["0.jpg", "1.jpg"])
        conv["members"] = [("0.jpg", photo)]
    elif kind == "unknown_role":
        turns.append({"from": "robot", "value": rng.choice(captions())})
    elif kind == "value_not_string":
        turns.append({"from": "human", "value": 42})
    elif kind == "from_missing":
        turns.append({"value": rng.choice(captions())})
    elif kind == "no_conversations":
        del conv["conversations"]
    elif kind == "conversations_not_list":
        conv["json"] = {"conversations": IMAGE + "\n" + rng.choice(captions())}
    elif kind == "no_assistant":
        turns[1] = {"from": "human", "value": rng.choice(FOLLOW_UPS)}
    else:
        raise ValueError(f"unknown bad conversation kind {kind!r}; known: {sorted(BAD_KINDS)}")
    return conv


def write_bad_llava_tar(path: str, kind: str, *, good: int = 2, seed: int = 7) -> tuple[str, str]:
    """A tar holding the bad conversation ``kind`` between ``good`` real conversations on each
    side (keys ``conv-s<seed>-*``); returns (path, the bad conversation's key)."""
    bad = bad_conversation(kind)
    convs = real_conversations(2 * good, seed=seed)
    write_llava_tar(path, convs[:good] + [bad] + convs[good:])
    return path, bad["key"]
