"""Videos in conversations (LLaVA-Video-178K's layout: a ``video`` or ``videos`` field naming
members, ``<video>`` placeholders) under Qwen2-VL's video rule (issue 54), from tars of clips
FFmpeg's CLI makes from real photos (tests/video_clips.py), mixed with photos in the same
conversations:

* against the references: each conversation's ids are ``Qwen2VLProcessor``'s for its rendered
  text, its videos' grids are the processor's ``video_grid_thw`` for the frames ``qwen-vl-utils``'
  ``fetch_video`` reads (its own sampler and resize, through TorchCodec), and the rows of
  ``pixel_values_videos`` are within a stated error of the processor's, un-normalised;
* packing is invisible to the model: a tiny ``Qwen2VLForConditionalGeneration`` gives every run
  of a packed row the logits of that run fed alone, and the batch's M-RoPE positions are the
  model's own ``get_rope_index`` of the run alone;
* a bad video is its document's typed reason, counted; a spec without a video rule skips a
  conversation with a video by reason.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("torchcodec", reason="requirements/video.txt (scripts/env.sh installs it)")
vp = pytest.importorskip("qwen_vl_utils.vision_process", reason="requirements/video.txt")

import video_clips  # noqa: E402
from qwen_reference import (  # noqa: E402
    EOS,
    VISION_END,
    VISION_START,
    make_image_processor,
    render_conversation,
    tiny_qwen2_vl_config,
)
from shardstream import (  # noqa: E402
    Conversations,
    InterleavedLoader,
    QwenVideo,
    QwenVL,
    QwenVLCollator,
    count_interleaved,
)
from video_conversations import VIDEO_PAD, write_tokenizer  # noqa: E402

PAD = 2  # "<pad>" of the tokenizer fixture: never in a document
# A frame of at most 16 merge blocks, 64 for a video's frames in all: small grids, real pixels.
VIDEO = QwenVideo(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 16, total_pixels=28 * 28 * 64)
SPEC = QwenVL(min_pixels=56 * 56, max_pixels=28 * 28 * 64, video=VIDEO)
LOGIT_TOLERANCE = 1e-4
# Ours: FFmpeg's RGB resized by the image kinds' Pillow bicubic (uint8); qwen-vl-utils':
# TorchCodec's RGB resized by torchvision's antialiased bicubic (float). Measured: mean errors
# 0.16-0.18 levels, at most 4 to 9 at a pixel (float against fixed-point weights).
MEAN_ERROR, MAX_ERROR = 0.5, 16


@pytest.fixture(scope="module", autouse=True)
def torchcodec_reader():
    """qwen-vl-utils reads videos through TorchCodec (its choice is cached per process)."""
    before = os.environ.get("FORCE_QWENVL_VIDEO_READER")
    os.environ["FORCE_QWENVL_VIDEO_READER"] = "torchcodec"
    clear = getattr(vp.get_video_reader_backend, "cache_clear", lambda: None)
    clear()
    yield
    if before is None:
        del os.environ["FORCE_QWENVL_VIDEO_READER"]
    else:
        os.environ["FORCE_QWENVL_VIDEO_READER"] = before
    clear()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return write_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, str]:
    d = str(tmp_path_factory.mktemp("clips"))
    return {
        "h264": video_clips.make_clip(d, size=(160, 120), seconds=2.0, fps="25"),
        "vp9": video_clips.make_clip(d, codec="vp9", container="webm", size=(128, 96), seconds=3.0, fps="30"),
        "turned": video_clips.make_clip(d, size=(160, 120), seconds=1.5, fps="24", rotate=90, audio=True),
    }


def photo() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.open(video_clips.photo_path("coffee.png")).convert("RGB").resize((150, 100)).save(
        out, "JPEG", quality=90
    )
    return out.getvalue()


def conversations(clips: dict[str, str]) -> list[dict]:
    """LLaVA-Video conversations: a video alone, a photo then a video, two videos, and text."""

    def read(name: str) -> bytes:
        with open(clips[name], "rb") as f:
            return f.read()

    return [
        {
            "key": "a",
            "json": {"video": "clips/pan.mp4"},  # names no member: the sample's one video
            "members": [("mp4", read("h264"))],
            "turns": [("human", "<video>\nWhat does the camera do?"), ("gpt", "It pans over a photo.")],
        },
        {
            "key": "b",
            "json": {"image": "jpg", "video": "webm"},
            "members": [("jpg", photo()), ("webm", read("vp9"))],
            "turns": [
                ("human", "Here is a cup <image> and a clip <video>. Same scene?"),
                ("gpt", "No: a cup, then an astronaut."),
                ("human", "And the sky?"),
                ("gpt", "There is none."),
            ],
        },
        {
            "key": "c",
            "json": {"videos": ["0.mp4", "1.mp4"]},
            "members": [("0.mp4", read("turned")), ("1.mp4", read("h264"))],
            "turns": [("human", "<video> <video> Which one is turned?"), ("gpt", "The first.")],
        },
        {
            "key": "d",
            "json": {},
            "members": [],
            "turns": [("human", "No picture today."), ("gpt", "Then tell me a story.")],
        },
    ]


def write_tar(path: str, convs: list[dict]) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for conv in convs:
            turns = [{"from": f, "value": v} for f, v in conv["turns"]]
            meta = {"id": conv["key"], "conversations": turns, **conv["json"]}
            members = [("json", json.dumps(meta).encode()), *conv["members"]]
            for ext, data in members:
                info = tarfile.TarInfo(f"{conv['key']}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return path


def count(tar: str, tokenizer: str, spec: QwenVL = SPEC, **kw):
    options = dict(seq_len=640, batch_size=2, max_patches_per_batch=4096, eos_token=EOS)
    return count_interleaved(
        [tar], tokenizer=tokenizer, spec=spec, layout=Conversations(), **{**options, **kw}
    )


@pytest.fixture(scope="module")
def corpus(clips, tokenizer, tmp_path_factory):
    convs = conversations(clips)
    tar = write_tar(str(tmp_path_factory.mktemp("tars") / "video-convs.tar"), convs)
    return convs, tar


def clip_paths(clips: dict[str, str]) -> dict[str, list[str]]:
    """The clips of each conversation of :func:`conversations`, in placeholder order."""
    return {"a": [clips["h264"]], "b": [clips["vp9"]], "c": [clips["turned"], clips["h264"]], "d": []}


def budgets() -> dict[str, float]:
    """:data:`VIDEO`'s pixel budgets as ``fetch_video`` takes them."""
    return {
        "min_pixels": VIDEO.min_pixels,
        "max_pixels": VIDEO.max_pixels,
        "total_pixels": VIDEO.total_pixels,
    }


def reference(conv: dict, clips_of: list[str], processor) -> dict:
    """transformers and qwen-vl-utils on one conversation: ``fetch_video`` reads each video
    (its sampler and its resize under :data:`VIDEO`'s budgets, through TorchCodec), and
    ``Qwen2VLProcessor`` expands the rendered text's runs and lays out the rows (no resize, no
    rescale, no normalisation: the values stay on 0..255)."""
    turns = [{"from": f, "value": v} for f, v in conv["turns"]]
    text = render_conversation(turns).replace("<video>", VISION_START + VIDEO_PAD + VISION_END)
    frames = []
    for path in clips_of:
        frames.append(vp.fetch_video({"video": path, **budgets()}))
    images = [_decoded(m) for e, m in conv["members"] if e == "jpg"]
    out = processor(
        text=[text],
        images=images or None,
        videos=frames or None,
        add_special_tokens=False,
        images_kwargs={"do_rescale": False, "do_normalize": False},
        videos_kwargs={
            "do_resize": False,
            "do_sample_frames": False,
            "do_rescale": False,
            "do_normalize": False,
        },
        return_tensors="np",
    )
    return {
        "input_ids": [int(i) for i in out["input_ids"][0]],
        "video_grid_thw": np.asarray(out.get("video_grid_thw", np.zeros((0, 3))), dtype=np.int64),
        "pixel_values_videos": np.asarray(
            out.get("pixel_values_videos", np.zeros((0, 1176))), dtype=np.float32
        ),
        "image_grid_thw": np.asarray(out.get("image_grid_thw", np.zeros((0, 3))), dtype=np.int64),
    }


def _decoded(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def make_processor(tokenizer: str):
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    video_processor = transformers.Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = transformers.Qwen2VLProcessor(
        image_processor=make_image_processor(SPEC.min_pixels, SPEC.max_pixels),
        tokenizer=tok,
        video_processor=video_processor,
    )
    assert processor.video_token == VIDEO_PAD
    return processor


def documents_of(batches, video_pad: int, start: int) -> dict[str, dict]:
    """Each conversation from its runs: ids, labels, its videos' grids and rows."""
    out: dict[str, dict] = {}
    for b in batches:
        flat = b.input_ids.reshape(-1).tolist()
        cu = b.cu_seqlens.tolist()
        runs = [(a, e) for a, e in zip(cu, cu[1:], strict=False) if any(t != PAD for t in flat[a:e])]
        assert len(runs) == len(b.keys)
        grids = [] if b.video_grid_thw is None else b.video_grid_thw.tolist()
        video, row = 0, 0
        for (a, e), key in zip(runs, b.keys, strict=True):
            doc = out.setdefault(key, {"ids": [], "labels": [], "grids": [], "rows": []})
            doc["ids"] += flat[a:e]
            doc["labels"] += b.labels.reshape(-1)[a:e].tolist()
            for i in range(a, e - 1):
                if flat[i] == start and flat[i + 1] == video_pad:
                    n = int(np.prod(grids[video]))
                    doc["grids"].append(grids[video])
                    doc["rows"].append(b.pixel_values_videos[row : row + n].numpy())
                    video, row = video + 1, row + n
        assert video == len(grids)
    return out


def test_conversations_with_videos_equal_qwen_vl_utils_and_the_processor(corpus, clips, tokenizer):
    convs, tar = corpus
    counts = count(tar, tokenizer)
    assert counts.skipped == {}, counts.skipped
    assert sum(u["videos"] for u in counts.units) == 4
    loader = InterleavedLoader(counts, pad_token_id=PAD, threads=2)
    batches = list(loader)
    processor = make_processor(tokenizer)
    start, video_pad = loader.vision_token_ids[0], loader.video_token_id
    assert video_pad == processor.video_token_id
    docs = documents_of(batches, video_pad, start)
    assert sorted(docs) == ["a", "b", "c", "d"]
    paths = clip_paths(clips)
    errors = []
    for conv in convs:
        key = conv["key"]
        want = reference(conv, paths[key], processor)
        got = docs[key]
        eos = processor.tokenizer.convert_tokens_to_ids(EOS)
        assert got["ids"] == want["input_ids"] + [eos], key
        assert got["grids"] == want["video_grid_thw"].tolist(), key
        # Labels: the assistant answers alone (vision runs never).
        learned = [t for t, lab in zip(got["ids"], got["labels"], strict=True) if lab != -100]
        assert video_pad not in learned and start not in learned
        rows = np.concatenate(got["rows"]) if got["rows"] else np.zeros((0, 1176), np.uint8)
        assert rows.shape == want["pixel_values_videos"].shape, key
        if len(rows):
            diff = np.abs(rows.astype(np.float32) - want["pixel_values_videos"])
            errors.append((key, float(diff.mean()), float(diff.max())))
    print("pixel_values_videos against the processor's (key, mean, max):", errors)
    assert errors and all(mean < MEAN_ERROR and top <= MAX_ERROR for _, mean, top in errors), errors
    stats = loader.stats
    assert stats["videos"] == 4 and stats["images"] == 1, stats


def assert_each_run_alone(loader, model, second_per_grid: dict[str, list[float]] | None = None) -> dict:
    """Each run of every packed batch: its logits equal those of the run fed alone (1e-4), and
    its M-RoPE positions are the model's ``get_rope_index`` of it alone (Qwen2.5-VL's given
    ``second_per_grid``: key -> each video's ``second_per_grid_ts``)."""
    collate = QwenVLCollator()
    start = loader.vision_token_ids[0]
    compared = {"runs": 0, "videos": 0, "rows_with_several": 0}
    for batch in loader:
        inputs = collate(batch)
        inputs.pop("labels")
        with torch.no_grad():
            packed = model(**inputs).logits
        cu = batch.cu_seqlens.tolist()
        flat = batch.input_ids.reshape(-1)
        seq_len = batch.input_ids.shape[1]
        videos = inputs.get("video_grid_thw", torch.zeros((0, 3), dtype=torch.int64))
        images = inputs.get("image_grid_thw", torch.zeros((0, 3), dtype=torch.int64))
        v = i = v_row = i_row = 0
        runs = [(a, e) for a, e in zip(cu, cu[1:], strict=False) if bool((flat[a:e] != PAD).any())]
        rows_of = [a // seq_len for a, _ in runs]
        compared["rows_with_several"] += sum(rows_of.count(r) > 1 for r in set(rows_of))
        for (a, e), key in zip(runs, batch.keys, strict=True):
            row, at, end = a // seq_len, a % seq_len, a % seq_len + (e - a)
            ids = batch.input_ids[row, at:end]
            kinds = batch.mm_token_type_ids[row, at:end]
            starts = (ids[:-1] == start).nonzero().flatten().tolist()
            n_videos = sum(int(kinds[s + 1]) == 2 for s in starts)
            n_images = sum(int(kinds[s + 1]) == 1 for s in starts)
            alone = {"input_ids": ids[None], "mm_token_type_ids": kinds[None]}
            if n_videos:
                g = videos[v : v + n_videos]
                n = int(g.prod(-1).sum())
                alone["pixel_values_videos"] = inputs["pixel_values_videos"][v_row : v_row + n]
                alone["video_grid_thw"] = g
                if second_per_grid is not None:
                    alone["second_per_grid_ts"] = torch.tensor(second_per_grid[key])
                v, v_row = v + n_videos, v_row + n
            if n_images:
                g = images[i : i + n_images]
                n = int(g.prod(-1).sum())
                alone["pixel_values"] = inputs["pixel_values"][i_row : i_row + n]
                alone["image_grid_thw"] = g
                i, i_row = i + n_images, i_row + n
            with torch.no_grad():
                want = model(**alone).logits[0]
                grids = {
                    k: alone[k]
                    for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
                    if k in alone
                }
                rope, _ = model.model.get_rope_index(ids[None], kinds[None], **grids)
            diff = float((packed[row, at:end] - want).abs().max())
            assert diff < LOGIT_TOLERANCE, (key, row, at, end, diff)
            assert torch.equal(inputs["position_ids"][1:, row, at:end], rope[:, 0]), (key, row, at)
            assert inputs["position_ids"][0, row, at:end].tolist() == list(range(end - at))
            compared["runs"] += 1
            compared["videos"] += n_videos
        assert v == len(videos) and i == len(images)
    return compared


def test_packed_rows_with_videos_give_each_run_its_logits_alone(corpus, tokenizer):
    """Many short conversations a row: each run's logits in the packed batch equal those of
    the run fed alone, and its M-RoPE positions are ``get_rope_index``'s for it alone."""
    import tokenizers

    _, tar = corpus
    counts = count(tar, tokenizer, seq_len=1024, batch_size=1)
    loader = InterleavedLoader(counts, pad_token_id=PAD, threads=2)
    vocab = tokenizers.Tokenizer.from_file(tokenizer).get_vocab_size()
    config = tiny_qwen2_vl_config(vocab, loader.vision_token_ids, layers=2, pad_id=PAD)
    config.video_token_id = loader.video_token_id
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa"
    ).eval()
    compared = assert_each_run_alone(loader, model)
    assert compared["runs"] == 4 and compared["videos"] == 4 and compared["rows_with_several"] >= 1, compared


def tiny_qwen2_5_vl(vocab: int, loader, tokens_per_second: int):
    """A Qwen2.5-VL as :func:`qwen_reference.tiny_qwen2_vl_config`'s, its vision tower Qwen2.5's
    (window attention, one full-attention block) with ``tokens_per_second``."""
    base = tiny_qwen2_vl_config(vocab, loader.vision_token_ids, layers=2, pad_id=PAD)
    vision = {
        "depth": 1, "hidden_size": 32, "out_hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
        "fullatt_block_indexes": [0], "tokens_per_second": tokens_per_second,
    }  # fmt: skip
    start, end, image = loader.vision_token_ids
    config = transformers.Qwen2_5_VLConfig(
        text_config=base.text_config.to_dict(), vision_config=vision, image_token_id=image,
        video_token_id=loader.video_token_id, vision_start_token_id=start, vision_end_token_id=end,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen2_5_VLForConditionalGeneration._from_config(
        config, attn_implementation="sdpa"
    ).eval()


def test_qwen2_5_vl_time_scaled_positions_are_its_own_for_each_run_alone(corpus, clips, tokenizer):
    """Under ``tokens_per_second`` (Qwen2.5-VL), a video's temporal positions step by the
    seconds a temporal patch spans: each run's are the model's ``get_rope_index`` of it alone
    with ``second_per_grid_ts`` = ``temporal_patch_size / fps`` as its processor computes it,
    ``fps`` being the rate ``qwen-vl-utils`` sampled at; and its logits are the run's alone."""
    import tokenizers

    _, tar = corpus
    tokens_per_second = 4
    video = QwenVideo(**{**VIDEO.__dict__, "tokens_per_second": tokens_per_second})
    spec = QwenVL(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels, video=video)
    counts = count(tar, tokenizer, spec=spec, seq_len=1024, batch_size=1)
    loader = InterleavedLoader(counts, pad_token_id=PAD, threads=2)
    second_per_grid = {}
    for key, paths in clip_paths(clips).items():
        fps = [vp.fetch_video({"video": p, **budgets()}, return_video_sample_fps=True)[1] for p in paths]
        second_per_grid[key] = [2 / f for f in fps]
    vocab = tokenizers.Tokenizer.from_file(tokenizer).get_vocab_size()
    model = tiny_qwen2_5_vl(vocab, loader, tokens_per_second)
    compared = assert_each_run_alone(loader, model, second_per_grid)
    assert compared["videos"] == 4, compared
    # The scaling is not a no-op here: some video's temporal positions step by more than 1.
    batch = next(iter(loader))
    t = batch.mrope_position_ids[0][batch.mm_token_type_ids == 2]
    assert int((t.diff() > 1).sum()) > 0


def test_bad_videos_are_their_documents_reasons(clips, tokenizer, tmp_path):
    with open(clips["h264"], "rb") as f:
        good = f.read()
    turns = [("human", "<video> What is it?"), ("gpt", "A pan.")]
    convs = [
        {"key": "ok", "json": {"video": "mp4"}, "members": [("mp4", good)], "turns": turns},
        {
            "key": "cut",
            "json": {"video": "mp4"},
            "members": [("mp4", good[: len(good) // 3])],
            "turns": turns,
        },
        {"key": "notvideo", "json": {"video": "mp4"}, "members": [("mp4", b"\x00" * 4096)], "turns": turns},
        {
            "key": "absent",
            "json": {"videos": ["0.mp4", "1.mp4"]},
            "members": [("0.mp4", good)],
            "turns": turns,
        },
        {
            "key": "unplaced",
            "json": {"video": "mp4"},
            "members": [("mp4", good)],
            "turns": [("human", "Hi"), ("gpt", "Hello")],
        },
    ]
    text = {"key": "text", "json": {}, "members": [], "turns": [("human", "Hi"), ("gpt", "Hello")]}
    tar = write_tar(str(tmp_path / "bad.tar"), convs)
    counts = count(tar, tokenizer)
    assert counts.documents == 1, counts.units
    assert counts.skipped == {"corrupt_video": 2, "missing_video": 1, "misaligned_document": 1}, (
        counts.skipped
    )
    # A run of 26 tokens (4 frames of 84x112: a 2 x 6 x 8 grid) is longer than a row of 20.
    small = count(write_tar(str(tmp_path / "ok.tar"), [convs[0], text]), tokenizer, seq_len=20)
    assert small.skipped == {"video_over_row": 1}, small.skipped
    # Over max_seconds, from the header.
    short = QwenVL(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels, video=QwenVideo(max_seconds=1.0))
    assert count(os.path.join(tmp_path, "ok.tar"), tokenizer, spec=short).skipped == {"video_too_long": 1}
    # A spec without a video rule skips conversations with videos by reason.
    no_video = QwenVL(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    assert count(os.path.join(tmp_path, "ok.tar"), tokenizer, spec=no_video).skipped == {
        "misaligned_document": 1
    }
