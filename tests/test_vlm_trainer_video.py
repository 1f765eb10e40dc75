"""A VLM trains on video conversations and images through transformers.Trainer (ShardTrainer and
QwenVLCollator) on 2 CPU ranks under torchrun, each reading through 2 DataLoader workers, as
test_vlm_trainer.py trains on images (its worker, vlm_trainer_worker.py): a tiny
Qwen2VLForConditionalGeneration, its ``video_token_id`` the loader's ``<|video_pad|>``, on packed
LLaVA-Video conversations of short clips FFmpeg's CLI makes from real photos (five clips of
four codecs in four containers, one turned and with sound, each reused by several
conversations) mixed with LLaVA conversations of real photos and captions, under
QwenVL(video=QwenVideo(...)). The batches it trains on hold videos and images; its loss falls;
stopped at step n with a checkpoint, resume_from_checkpoint trains on exactly the uninterrupted
run's batches (ids, images' and videos' pixels) from step n+1."""

from __future__ import annotations

import json
import random

import pytest
import video_clips
from conversation_corpus import real_conversations, write_llava_tar
from integration_support import launch
from qwen_reference import EOS
from shardstream import Conversations, InterleavedLoader, QwenVideo, QwenVL, count_interleaved
from video_conversations import video_conversations, write_tokenizer
from vlm_trainer_worker import PAD, batch_hash, batch_vision

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STOP, STEPS = 3, 8
WORKERS = 2
#: name -> video_clips.make_clip's arguments: 1 to 2 s, at most 160x120.
CLIPS = {
    "pan.mp4": {"size": (160, 120), "seconds": 2.0, "fps": "25"},
    "cup.webm": {
        "codec": "vp9", "container": "webm", "size": (128, 96), "seconds": 1.5, "fps": "30",
        "photo": "coffee.png",
    },
    "cat.mkv": {
        "codec": "hevc", "container": "mkv", "size": (160, 120), "seconds": 1.0, "fps": "24",
        "photo": "chelsea.png",
    },
    "rocket.mp4": {
        "codec": "av1", "container": "mp4", "size": (160, 112), "seconds": 1.5, "fps": "25",
        "photo": "rocket.jpg",
    },
    "turned.mov": {
        "container": "mov", "size": (160, 120), "seconds": 1.0, "fps": "30000/1001", "rotate": 90,
        "audio": True, "photo": "coffee.png",
    },
}  # fmt: skip
VIDEO_CONVERSATIONS, IMAGE_CONVERSATIONS = 16, 24
VIDEOS = 20  # 16 conversations, one in four with two videos (video_conversations.VIDEO_CASES)
# A frame of at most 16 merge blocks, 64 for a video's frames in all (test_interleaved_video.py's).
SPEC = QwenVL(
    max_pixels=28 * 28 * 64,
    video=QwenVideo(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 16, total_pixels=28 * 28 * 64),
)


def logged(directory, rank: int, what: str = "batches") -> list:
    with open(directory / f"{what}-rank{rank}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-trainer-video")
    clips = {}
    for name, how in CLIPS.items():
        with open(video_clips.make_clip(str(root), **how), "rb") as f:
            clips[name] = f.read()
    convs = video_conversations(VIDEO_CONVERSATIONS, clips, seed=3) + real_conversations(
        IMAGE_CONVERSATIONS, seed=4
    )
    random.Random(0).shuffle(convs)
    files = [write_llava_tar(str(root / f"part-{i}.tar"), convs[i::2]) for i in range(2)]
    tokenizer = write_tokenizer(str(root / "tokenizer.json"))
    counts_path = str(root / "counts.json")
    counts = count_interleaved(
        files, tokenizer=tokenizer, spec=SPEC, layout=Conversations(), seq_len=512, batch_size=2,
        eos_token=EOS, output=counts_path,
    )  # fmt: skip
    assert counts.skipped == {}, counts.skipped
    assert counts.documents == VIDEO_CONVERSATIONS + IMAGE_CONVERSATIONS
    assert sum(u["videos"] for u in counts.units) == VIDEOS
    assert counts.total_batches >= 2 * STEPS

    def train(name, *, max_steps, resume=None):
        args = [
            "--counts", counts_path, "--output-dir", str(root / name / "out"), "--log-dir",
            str(root / name / "log"), "--max-steps", str(max_steps), "--save-steps", str(STOP),
            "--workers", str(WORKERS),
        ]  # fmt: skip
        if resume is not None:
            args += ["--resume", str(resume)]
        run = launch("vlm_trainer_worker.py", args, nproc=2, timeout=300)
        assert run.returncode == 0, f"{name} failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        return root / name

    def reference(rank: int) -> tuple[list[str], list[dict]]:
        loader = InterleavedLoader(counts, pad_token_id=PAD, rank=rank, world_size=2)
        batches = list(loader.dataloader(WORKERS))
        return [batch_hash(b) for b in batches], [batch_vision(b) for b in batches]

    full = [reference(r) for r in range(2)]
    uninterrupted = train("full", max_steps=STEPS)
    stopped = train("stopped", max_steps=STOP)
    resumed = train("resumed", max_steps=STEPS, resume=stopped / "out" / f"checkpoint-{STOP}")
    return {"full": full, "uninterrupted": uninterrupted, "stopped": stopped, "resumed": resumed}


def test_the_trainer_trains_on_videos_and_images(runs):
    for rank in range(2):
        seen = logged(runs["uninterrupted"] / "log", rank, "vision")
        assert seen == runs["full"][rank][1][:STEPS], f"rank {rank}"
        # Videos before the checkpoint and after it, on every rank; images too.
        for steps in (seen[:STOP], seen[STOP:]):
            assert any(b["video_rows"] > 0 for b in steps), (rank, seen)
        assert all((b["videos"] > 0) == (b["video_rows"] > 0) for b in seen), seen
        assert any(b["image_rows"] > 0 for b in seen), (rank, seen)
        assert logged(runs["resumed"] / "log", rank, "vision") == seen[STOP:]


def test_the_loss_falls(runs):
    with open(runs["uninterrupted"] / "log" / "loss.jsonl", encoding="utf-8") as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.5, losses


def test_resume_from_checkpoint_trains_on_the_uninterrupted_batches(runs):
    for rank in range(2):
        full = runs["full"][rank][0]
        assert logged(runs["uninterrupted"] / "log", rank) == full[:STEPS]
        assert logged(runs["stopped"] / "log", rank) == full[:STOP]
        assert logged(runs["resumed"] / "log", rank) == full[STOP:STEPS], f"rank {rank}"
