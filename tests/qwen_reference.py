"""The reference for interleaved documents under the Qwen2-VL spec: transformers' own
``Qwen2VLProcessor``, built offline from the committed GPT-2-style tokenizer fixture
(tests/data/tokenizers/captions-bpe.json) and the PIL image processor.

What transformers 5.24 does (read from its source and checked by tests/test_qwen_reference.py):

* Class names. ``Qwen2VLImageProcessorPil`` is the "slow" processor (PIL resize, numpy);
  ``Qwen2VLImageProcessor`` is the "fast" one (torchvision); ``Qwen2VLImageProcessorFast`` is a
  deprecated alias of the fast one. ``Qwen2VLProcessor(image_processor, tokenizer,
  video_processor)`` refuses ``video_processor=None`` (TypeError), so a default
  ``Qwen2VLVideoProcessor()`` is passed; it is never used here.
* The image token. The processor takes ``tokenizer.image_token`` when the tokenizer has that
  attribute, else the string ``"<|image_pad|>"``, and its id from ``tokenizer.image_token_id`` or
  ``convert_tokens_to_ids``. A tokenizer loaded from a bare tokenizer.json has no such attribute,
  so adding ``<|image_pad|>`` as a special token is enough. ``<|vision_start|>`` and
  ``<|vision_end|>`` are plain text for the processor: it expands each ``<|image_pad|>`` (in
  order, one per image) to ``t*h*w / merge_size**2`` copies and tokenizes the whole string.
* Tokenizer. ``PreTrainedTokenizerFast`` is now ``TokenizersBackend``. The fixture's vocabulary
  has 1,000 entries and three special tokens, ``<s>`` 0, ``</s>`` 1, ``<pad>`` 2: no
  ``<|endoftext|>``, and loading the bare file sets no eos/pad token. The three vision tokens are
  added after the vocabulary: ``<|vision_start|>`` 1000, ``<|vision_end|>`` 1001,
  ``<|image_pad|>`` 1002 (in the order added). The file's post-processor is ``<s> $A </s>``, and
  the processor's default ``add_special_tokens=True`` would wrap the document in them: the
  reference passes ``add_special_tokens=False`` and appends the EOS (``</s>``, :data:`EOS`)
  itself.
* Pieces between special tokens are tokenized apart. The added (special) tokens split the string
  first; each piece then goes through NFC and the ByteLevel pre-tokenizer with
  ``add_prefix_space=True`` on its own: a text segment that follows an image gets a space
  prepended unless it starts with one (``"x<|vision_end|>cat"`` and ``"x<|vision_end|> cat"``
  give the same ids for "cat"), as does the document's first piece. Adjacent text positions are
  one piece (concatenated with nothing between them before tokenizing).
* Resize (slow). The image is decoded and converted to RGB by the caller (``Image.open(...)
  .convert("RGB")``), turned into a uint8 numpy array (channels first), and resized back in PIL:
  ``to_pil_image`` (no rescale: the array is uint8) then ``PIL.Image.resize((w, h), BICUBIC)``
  on the uint8 RGB image (Pillow's separable, antialiased bicubic, a = -0.5, support scaled by the
  downscale factor; fixed-point weights of 22 fractional bits; the horizontal pass first, its
  result rounded and clipped to uint8, then the vertical pass, rounded and clipped again), back
  to numpy. An image already at its
  target size is copied unchanged. ``do_rescale=False, do_normalize=False`` leave the uint8
  values; ``patchify`` casts to float32, so ``pixel_values`` are whole numbers in 0..255.
* The target size, ``smart_resize(height, width, factor=28, min_pixels, max_pixels)``: it raises
  ``ValueError`` when ``max(h, w) / min(h, w) > 200``; else ``h_bar = round(h / 28) * 28`` (Python's
  round: ties to even, so 70 -> 56 and 126 -> 112, where rounding half up gives 84 and 140; a side
  under 14 rounds to 0), the same for ``w``; if ``h_bar * w_bar > max_pixels``: ``beta =
  sqrt(h * w / max_pixels)``, ``h_bar = max(28, floor(h / beta / 28) * 28)``; elif ``h_bar * w_bar <
  min_pixels``: ``beta = sqrt(min_pixels / (h * w))``, ``h_bar = ceil(h * beta / 28) * 28``; same for
  ``w`` (float64, in that order of operations). No longer any "smaller than factor" error; the
  result may fall outside [min_pixels, max_pixels] (``max(28, ...)`` on a thin strip, ``ceil`` on
  both sides).
* ``pixel_values`` rows. One image: ``grid_t = 1``, ``grid_h = H / 14``, ``grid_w = W / 14``; its
  rows are in the order (grid_h/2, grid_w/2, 2, 2), i.e. merge blocks of 2x2 patches in raster
  order, the 4 patches of a block in raster order; each row's 1176 columns are (channel 3,
  temporal 2, 14, 14): the temporal axis is the same frame twice (a broadcast, not padding with
  zeros). Images are concatenated in the document's order; ``image_grid_thw`` is int64 ``[n, 3]``
  of (1, grid_h, grid_w).
* The fast processor resizes uint8 tensors with ``torchvision.transforms.v2.functional.resize(...,
  BICUBIC, antialias=True)``, and groups images of one shape into a batch.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "data", "tokenizers", "captions-bpe.json")

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
#: The fixture's end-of-document token (it has no ``<|endoftext|>``).
EOS = "</s>"
PAD = "<pad>"
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE
#: Columns of a ``pixel_values`` row: channel x temporal x patch x patch.
PATCH_DIM = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE
#: Qwen2-VL's defaults (the image processors' ``size``).
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
#: One image in the text given to the processor; it expands the pad to the image's run.
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END


def make_tokenizer(tokenizer_path: str = TOKENIZER):
    """The fixture as a transformers tokenizer, with the three vision tokens added as special
    tokens (ids ``vocab``, ``vocab + 1``, ``vocab + 2``: 1000, 1001, 1002 for the fixture) and
    ``</s>`` / ``<pad>`` named as its eos / pad tokens."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path, eos_token=EOS, pad_token=PAD)
    tok.add_special_tokens({"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD]})
    return tok


def write_tokenizer_json(path: str, tokenizer_path: str = TOKENIZER) -> str:
    """The fixture with the three vision tokens added as special tokens (ids 1000-1002, not
    normalised), saved by ``tokenizers`` as ``path``: a tokenizer.json that holds them, as Qwen's
    own does, for a loader that reads the vision tokens' ids from the file. Loading it in
    :func:`make_tokenizer` gives the same ids. Returns ``path``."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in (VISION_START, VISION_END, IMAGE_PAD)]
    )
    tok.save(path)
    return path


def make_image_processor(min_pixels: int, max_pixels: int, *, fast: bool = False):
    """Qwen2-VL's image processor (patch 14, merge 2, temporal patch 2) at these pixel bounds,
    without rescaling or normalising (values stay on the 0..255 scale): the PIL one
    (``Qwen2VLImageProcessorPil``), or with ``fast`` the torchvision one
    (``Qwen2VLImageProcessor``)."""
    import transformers

    cls = transformers.Qwen2VLImageProcessor if fast else transformers.Qwen2VLImageProcessorPil
    return cls(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        do_rescale=False,
        do_normalize=False,
    )


def make_processor(min_pixels: int, max_pixels: int, *, fast: bool = False, tokenizer_path: str = TOKENIZER):
    """``transformers.Qwen2VLProcessor`` of :func:`make_image_processor` (PIL unless ``fast``) and
    :func:`make_tokenizer`; a default ``Qwen2VLVideoProcessor`` fills the slot the constructor
    requires."""
    import transformers

    processor = transformers.Qwen2VLProcessor(
        image_processor=make_image_processor(min_pixels, max_pixels, fast=fast),
        tokenizer=make_tokenizer(tokenizer_path),
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )
    assert processor.image_token == IMAGE_PAD, processor.image_token
    return processor


def reference_added_ids(processor) -> tuple[int, int, int]:
    """(vision_start, vision_end, image_pad) ids of the processor's tokenizer."""
    ids = processor.tokenizer.convert_tokens_to_ids([VISION_START, VISION_END, IMAGE_PAD])
    assert ids[2] == processor.image_token_id
    return tuple(ids)


def eos_id(processor) -> int:
    """The id of :data:`EOS` (``</s>``, 1 in the fixture)."""
    return processor.tokenizer.convert_tokens_to_ids(EOS)


def decode_image(data: bytes):
    """A document's image as the reference sees it: PIL decode, converted to RGB."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def document_text(doc: dict) -> tuple[str, list[bytes]]:
    """(the text given to the processor, the document's images in order): text positions as they
    are, nothing between them, :data:`IMAGE_PLACEHOLDER` per image."""
    if len(doc["texts"]) != len(doc["images"]):
        raise ValueError(f"{doc.get('key')}: texts and images lists differ in length")
    parts: list[str] = []
    images: list[bytes] = []
    for j, (text, image) in enumerate(zip(doc["texts"], doc["images"], strict=True)):
        if (text is None) == (image is None):
            raise ValueError(f"{doc.get('key')}: position {j} must hold exactly one of a text or an image")
        if image is not None:
            parts.append(IMAGE_PLACEHOLDER)
            images.append(image)
        else:
            parts.append(text)
    return "".join(parts), images


def reference_document(processor, doc: dict, eos_id: int) -> dict:
    """What the processor makes of one document (see the module's docstring):

    * ``input_ids``: ``list[int]``, the expanded text tokenized with ``add_special_tokens=False``,
      then ``eos_id``;
    * ``image_grid_thw``: int64 ``[n_images, 3]`` of (1, grid_h, grid_w);
    * ``pixel_values``: float32 ``[sum(t*h*w), 1176]``, un-normalised (whole numbers 0..255);
    * ``text``: the string given to the processor (before expansion).

    A document without images gives ``[0, 3]`` and ``[0, 1176]`` arrays. Raises what the processor
    raises (``ValueError`` for an aspect ratio over 200) and what PIL raises on bytes it cannot
    decode."""
    text, data = document_text(doc)
    images = [decode_image(b) for b in data] or None
    out = processor(
        text=[text],
        images=images,
        add_special_tokens=False,
        do_rescale=False,
        do_normalize=False,
        return_tensors="np",
    )
    if images is None:
        grid = np.zeros((0, 3), dtype=np.int64)
        pixels = np.zeros((0, PATCH_DIM), dtype=np.float32)
    else:
        grid = np.asarray(out["image_grid_thw"], dtype=np.int64)
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
    return {
        "input_ids": [int(i) for i in out["input_ids"][0]] + [int(eos_id)],
        "image_grid_thw": grid,
        "pixel_values": pixels,
        "text": text,
    }


def grid_thw(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
    """(1, grid_h, grid_w) of an image of ``height x width`` by transformers' own
    ``smart_resize``."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    h, w = smart_resize(height, width, factor=FACTOR, min_pixels=min_pixels, max_pixels=max_pixels)
    return 1, h // PATCH_SIZE, w // PATCH_SIZE


def image_tokens(grid) -> int:
    """The length of an image's ``<|image_pad|>`` run: t * h * w / merge_size**2."""
    t, h, w = (int(v) for v in grid)
    return t * h * w // (MERGE_SIZE * MERGE_SIZE)


def unpatchify(rows: np.ndarray, grid) -> np.ndarray:
    """One image's ``pixel_values`` rows back to ``[H, W, 3]`` (temporal frame 0), in the rows'
    dtype: the inverse of the processors' ``patchify``, for comparing pictures rather than rows."""
    t, gh, gw = (int(v) for v in grid)
    if t != 1:
        raise ValueError("one image has grid_t 1")
    p, m = PATCH_SIZE, MERGE_SIZE
    x = np.asarray(rows).reshape(gh // m, gw // m, m, m, 3, TEMPORAL_PATCH_SIZE, p, p)[:, :, :, :, :, 0]
    # (gh/m, gw/m, mh, mw, C, ph, pw) -> (gh/m, mh, ph, gw/m, mw, pw, C)
    return x.transpose(0, 2, 5, 1, 3, 6, 4).reshape(gh * p, gw * p, 3)


def patchify(image: np.ndarray) -> np.ndarray:
    """``[H, W, 3]`` (H and W multiples of 28) to ``[H*W/196, 1176]`` rows in the processors'
    order, the temporal axis repeated: the inverse of :func:`unpatchify`, in the image's dtype."""
    h, w, c = image.shape
    p, m = PATCH_SIZE, MERGE_SIZE
    gh, gw = h // p, w // p
    x = np.asarray(image).reshape(gh // m, m, p, gw // m, m, p, c).transpose(0, 3, 1, 4, 6, 2, 5)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], TEMPORAL_PATCH_SIZE, p, p))
    return x.reshape(gh * gw, c * TEMPORAL_PATCH_SIZE * p * p)


# -- conversations (LLaVA-style samples rendered as ChatML) --------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: The conversation placeholder of one image (LLaVA).
CONVERSATION_IMAGE = "<image>"
DEFAULT_SYSTEM = "You are a helpful assistant."
#: LLaVA's ``from`` values to chat roles (shardstream's ``Conversations.roles`` default).
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}

#: Qwen/Qwen2-VL-7B-Instruct's ``chat_template`` (its tokenizer_config.json / chat_template.json),
#: as published: a default system turn when the first message is not a system one, ChatML turns,
#: an image content item as ``<|vision_start|><|image_pad|><|vision_end|>``.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _jinja_literal(text: str) -> str:
    """``text`` as a Jinja expression printing it as is (JSON's escapes are Python's, which Jinja's
    string literals take)."""
    return "{{ " + json.dumps(text) + " }}" if text else ""


def chat_template(
    *,
    system: str | None = DEFAULT_SYSTEM,
    turn_start: str = IM_START + "{role}\n",
    turn_end: str = IM_END,
    turn_separator: str = "\n",
    generation: bool = True,
) -> str:
    """A ChatML template as Qwen2-VL's (:data:`QWEN2_VL_CHAT_TEMPLATE`) with these turn pieces
    (the defaults are Qwen2-VL's); with ``generation`` an assistant turn's content and
    ``turn_end`` are wrapped in ``{% generation %}...{% endgeneration %}``, the markers
    ``return_assistant_tokens_mask`` reads. Content items: ``{"type": "image"}`` renders
    :data:`IMAGE_PLACEHOLDER`, ``{"type": "text"}`` its text; a string content renders as is."""
    head, _, tail = turn_start.partition("{role}")
    header = _jinja_literal(head) + "{{ message['role'] }}" + _jinja_literal(tail)
    body = (
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for content in message['content'] %}"
        "{% if content['type'] == 'image' %}" + _jinja_literal(IMAGE_PLACEHOLDER) + ""
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
        + _jinja_literal(turn_end)
    )
    if generation:
        body = (
            "{% if message['role'] == 'assistant' %}{% generation %}" + body + "{% endgeneration %}"
            "{% else %}" + body + "{% endif %}"
        )
    default = ""
    if system is not None:
        system_header = _jinja_literal(turn_start.format(role="system"))
        default = (
            "{% if loop.first and message['role'] != 'system' %}"
            + system_header
            + _jinja_literal(system + turn_end + turn_separator)
            + "{% endif %}"
        )
    return (
        "{% for message in messages %}"
        + default
        + header
        + body
        + _jinja_literal(turn_separator)
        + ("{% endfor %}")
    )


def write_chat_tokenizer_json(path: str, tokenizer_path: str = TOKENIZER) -> str:
    """As :func:`write_tokenizer_json`, with ``<|im_start|>`` and ``<|im_end|>`` added as special
    tokens after the three vision tokens (ids 1003 and 1004 for the fixture). Returns ``path``."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens(
        [
            AddedToken(s, special=True, normalized=False)
            for s in (VISION_START, VISION_END, IMAGE_PAD, IM_START, IM_END)
        ]
    )
    tok.save(path)
    return path


def make_chat_processor(
    min_pixels: int, max_pixels: int, *, fast: bool = False, tokenizer_path: str = TOKENIZER
):
    """:func:`make_processor` whose tokenizer also holds ``<|im_start|>`` (1003) and ``<|im_end|>``
    (1004) as special tokens, in :func:`write_chat_tokenizer_json`'s order."""
    processor = make_processor(min_pixels, max_pixels, fast=fast, tokenizer_path=tokenizer_path)
    processor.tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    ids = processor.tokenizer.convert_tokens_to_ids([IM_START, IM_END])
    assert ids == [len(processor.tokenizer) - 2, len(processor.tokenizer) - 1], ids
    return processor


def conversation_messages(conv: list[dict], images: list, *, roles: dict | None = None) -> list[dict]:
    """A LLaVA conversation (``[{"from": ..., "value": ...}, ...]``) as chat messages: each turn's
    role by ``roles`` (default :data:`ROLES`), its content a list of ``{"type": "text"}`` items for
    the text between placeholders (empty ones left out) and ``{"type": "image", "image": ...}``
    where each :data:`CONVERSATION_IMAGE` stood, taking ``images`` in order over the whole
    conversation. Raises ``ValueError`` when the placeholders and the images differ in number."""
    roles = ROLES if roles is None else roles
    messages, used = [], 0
    for turn in conv:
        content: list[dict] = []
        for j, text in enumerate(turn["value"].split(CONVERSATION_IMAGE)):
            if j:
                if used == len(images):
                    raise ValueError("more image placeholders than images")
                content.append({"type": "image", "image": images[used]})
                used += 1
            if text:
                content.append({"type": "text", "text": text})
        messages.append({"role": roles[turn["from"]], "content": content})
    if used != len(images):
        raise ValueError(f"{used} image placeholders for {len(images)} images")
    return messages


def render_conversation(
    conv: list[dict],
    *,
    system: str | None = DEFAULT_SYSTEM,
    turn_start: str = IM_START + "{role}\n",
    turn_end: str = IM_END,
    turn_separator: str = "\n",
    roles: dict | None = None,
) -> str:
    """The ChatML rule in plain Python (before image expansion): the default system turn unless
    the first turn is a system one, then per turn its header, its value with each placeholder as
    :data:`IMAGE_PLACEHOLDER`, ``turn_end`` and ``turn_separator``. What :func:`chat_template`
    renders without the generation markers."""
    roles = ROLES if roles is None else roles
    out = []
    if system is not None and (not conv or roles[conv[0]["from"]] != "system"):
        out.append(turn_start.format(role="system") + system + turn_end + turn_separator)
    for turn in conv:
        value = turn["value"].replace(CONVERSATION_IMAGE, IMAGE_PLACEHOLDER)
        out.append(turn_start.format(role=roles[turn["from"]]) + value + turn_end + turn_separator)
    return "".join(out)


def reference_conversation(
    processor,
    conv: list[dict],
    images: list[bytes],
    eos_id: int,
    assistant_only: bool = True,
    **template,
) -> dict:
    """What transformers makes of one conversation: ``processor.apply_chat_template`` of
    :func:`conversation_messages` (images decoded as :func:`decode_image`) under
    :func:`chat_template` (``template`` passes its turn pieces), tokenized with
    ``add_special_tokens=False``, with ``return_assistant_tokens_mask=True``:

    * ``input_ids``: ``list[int]``, then ``eos_id``;
    * ``mask``: ``list[int]`` aligned with them, 1 where a token is trained: with
      ``assistant_only`` the processor's ``assistant_masks`` (a token overlapping, by character
      span, an assistant turn's content + ``turn_end``) and 0 for the EOS; else every token but
      the vision tokens (the EOS too);
    * ``image_grid_thw``, ``pixel_values`` as :func:`reference_document`'s;
    * ``text``: the rendered string (before image expansion)."""
    roles = template.pop("roles", None)
    pil = [decode_image(b) for b in images]
    messages = conversation_messages(conv, pil, roles=roles)
    out = processor.apply_chat_template(
        messages,
        chat_template=chat_template(**template),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        return_tensors="np",
        processor_kwargs={"add_special_tokens": False, "do_rescale": False, "do_normalize": False},
    )
    ids = [int(i) for i in out["input_ids"][0]]
    vision = set(reference_added_ids(processor))
    if assistant_only:
        mask = [int(m) for m in out["assistant_masks"][0]]
    else:
        mask = [0 if i in vision else 1 for i in ids]
    if pil:
        grid = np.asarray(out["image_grid_thw"], dtype=np.int64)
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
    else:
        grid = np.zeros((0, 3), dtype=np.int64)
        pixels = np.zeros((0, PATCH_DIM), dtype=np.float32)
    text = processor.apply_chat_template(messages, chat_template=chat_template(generation=False, **template))
    return {
        "input_ids": ids + [int(eos_id)],
        "mask": mask + [0 if assistant_only else 1],
        "image_grid_thw": grid,
        "pixel_values": pixels,
        "text": text,
    }


def tiny_qwen2_vl_config(vocab: int, vision_ids: tuple[int, int, int], *, layers: int, pad_id: int):
    """A ``Qwen2VLConfig`` small enough for CPU steps in milliseconds: ``layers`` decoder layers,
    M-RoPE sections (2, 3, 3) of a 16-wide head, a one-block vision tower with merge size 2;
    ``vision_ids`` are the loader's (start, end, image pad) token ids."""
    from transformers import Qwen2VLConfig

    start, end, image = vision_ids
    text = {
        "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "bos_token_id": None,
        "eos_token_id": None, "pad_token_id": pad_id,
    }  # fmt: skip
    vision = {
        "depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
    }  # fmt: skip
    return Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=image, vision_start_token_id=start,
        vision_end_token_id=end,
    )  # fmt: skip
