"""Video-text CLIP clips (``VideoLoader``) under a real torchrun, and on a variable-frame-rate
clip, from clips FFmpeg's CLI makes from real photos (tests/video_clips.py):

* 2 ranks (gloo, CPU) x 2 DataLoader workers (tests/video_worker.py), counted with
  ``count_clips(distributed=True)``: every clip once except a remainder smaller than a global
  batch, the same batches on both ranks, ``uint8 [B, T, 3, S, S]`` frames equal to a
  one-process read's; a state the job took after 2 batches, resumed by a second job on 3
  ranks, reads the rest of the epoch exactly once;
* a VFR MP4 (a dense second, then one frame in four, uneven timestamps checked with ffprobe):
  ``decode_frames`` gives TorchCodec's ``get_frames_at`` frames at the same numbers, and the
  loader samples it by frame number (``linspace`` over its frames, not over time), its frames
  as TorchCodec's resized by torchvision.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchcodec", reason="requirements/video.txt (scripts/env.sh installs it)")

import video_clips  # noqa: E402
from corpus import tar_bytes, write_file  # noqa: E402
from shardstream import video  # noqa: E402
from shardstream.kinds.video import VideoLoader, count_clips  # noqa: E402
from torchcodec.decoders import VideoDecoder  # noqa: E402
from train_support import torchrun  # noqa: E402
from video_clips import reference_clip  # noqa: E402
from video_worker import clip_digest  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "video_worker.py")
#: One torchrun launch; the worker's collectives give up after 60 s within it.
LAUNCH_TIMEOUT = 150
#: Clips a batch, frames a clip, pixels a side; the state is taken after SAVE_AFTER batches.
B, T, S = 2, 4, 48
SAVE_AFTER = 2
#: 5 shards of 3 clips.
SHARDS, PER_SHARD = 5, 3
CLIPS = SHARDS * PER_SHARD
#: The VFR clip: 2 s at 320x240 panned at 30 fps (2 pixels or more a frame, so that no two frames are
#: alike), every frame of the first second kept, then one in four.
VFR_SELECT = r"lt(n\,30)+not(mod(n\,4))"


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """5 shards of 3 clips each under their own keys: H.264 in MP4, VP9 in WebM and a portrait
    30 fps clip, of three photos, 1-1.2 s at 160x120."""
    d = str(tmp_path_factory.mktemp("clips"))
    clips = [
        video_clips.make_clip(d, seconds=1.0, size=(160, 120)),
        video_clips.make_clip(
            d, codec="vp9", container="webm", seconds=1.0, size=(160, 120), photo="coffee.png"
        ),
        video_clips.make_clip(d, seconds=1.2, size=(120, 160), fps="30", photo="rocket.jpg"),
    ]
    root = tmp_path_factory.mktemp("video-shards")
    paths = []
    for s in range(SHARDS):
        members = []
        for i in range(PER_SHARD):
            key, clip = f"s{s}-c{i}", clips[(s + i) % len(clips)]
            members += [
                (f"{key}.{clip.rsplit('.', 1)[1]}", read(clip)),
                (f"{key}.txt", f"clip {key}".encode()),
            ]
        paths.append(write_file(str(root / f"clips-{s:02d}.tar"), tar_bytes(members)))
    return paths


@pytest.fixture(scope="module")
def one_process(shards: list[str]) -> dict[str, tuple[list[int], str]]:
    """Every clip's frame numbers and frames digest as one process reads them, a clip a batch
    (so none is left in a remainder): what a clip becomes depends on its bytes alone."""
    counts = count_clips(shards, threads=1)
    assert counts.clips == CLIPS and counts.skipped == {}
    clips = {}
    for b in VideoLoader(counts, batch_size=1, frames=T, size=S, threads=1):
        clips[b.keys[0]] = (b.indices[0].tolist(), clip_digest(b.frames[0]))
    assert len(clips) == CLIPS
    return clips


def run_ranks(world: int, shards: list[str], out: Path, *args: str) -> list[dict[str, Any]]:
    """The worker on ``world`` ranks (2 DataLoader workers each): each rank's record."""
    out.mkdir()
    options = ["--batch-size", str(B), "--frames", str(T), "--size", str(S), "--workers", "2"]
    run = torchrun(
        ["--out", str(out), *options, *args, *shards], nproc=world, script=WORKER, timeout=LAUNCH_TIMEOUT
    )
    assert run.returncode == 0, f"torchrun (W={world}) failed:\n{run.stdout[-2000:]}\n{run.stderr[-6000:]}"
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    for r, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (r, world)
        assert (result["loader_rank"], result["loader_world_size"]) == (r, world), "from torch.distributed"
    return ranks


@pytest.fixture(scope="module")
def first_job(shards: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The 2-rank epoch, which also takes ``state_dict()`` after SAVE_AFTER batches."""
    return run_ranks(2, shards, tmp_path_factory.mktemp("job") / "w2", "--save-after", str(SAVE_AFTER))


def clips_read(ranks: list[dict[str, Any]], upto: int | None = None) -> list[tuple[str, list[int], str]]:
    """(key, frame numbers, frames digest) of every clip of the ranks' first ``upto`` batches."""
    return [
        clip
        for r in ranks
        for b in r["batches"][:upto]
        for clip in zip(b["keys"], b["indices"], b["digests"], strict=True)
    ]


def check_batches(ranks: list[dict[str, Any]]) -> int:
    """Every rank the same number of batches, as ``len()`` said; full ``uint8 [B, T, 3, S, S]``
    batches. Returns the batches per rank."""
    counts = [len(r["batches"]) for r in ranks]
    assert len(set(counts)) == 1 and counts[0] > 0, counts
    for r in ranks:
        assert r["len"] == counts[0] and r["all_batch_counts"] == counts
        for b in r["batches"]:
            assert b["shape"] == [B, T, 3, S, S] and b["dtype"] == "torch.uint8", b["shape"]
            assert np.array(b["indices"]).shape == (B, T)
    return counts[0]


@pytest.mark.timeout(300)
def test_two_ranks_read_every_clip_once_with_equal_batches(shards, one_process, first_job):
    identity = count_clips(shards, threads=1).identity()
    assert [r["counts"] for r in first_job] == [{"identity": identity, "clips": CLIPS}] * 2, (
        "the distributed count equals a one-process count, on every rank"
    )
    batches = check_batches(first_job)
    assert batches == CLIPS // (2 * B) == 3
    read_ = clips_read(first_job)
    keys = [key for key, _, _ in read_]
    assert len(keys) == len(set(keys)) == 2 * B * batches, "no clip twice"
    for key, indices, digest in read_:
        assert (indices, digest) == one_process[key], f"{key}: other frames than a one-process read"
    remainder = {r["remainder_clips"] for r in first_job}
    assert remainder == {CLIPS - len(keys)} == {CLIPS % (2 * B)} == {3}, remainder
    assert len(set(one_process) - set(keys)) == 3 < 2 * B, "the clips no rank read: fewer than a global batch"


@pytest.mark.timeout(300)
def test_a_state_saved_mid_epoch_resumes_onto_three_ranks_exactly_once(
    shards, one_process, first_job, tmp_path
):
    states = [r["state"] for r in first_job]
    assert states[0] is not None and states[0] == states[1], "every rank saves the same state"
    state = tmp_path / "state.json"
    state.write_text(json.dumps(states[0]))
    resumed = run_ranks(3, shards, tmp_path / "w3", "--resume-state", str(state))
    check_batches(resumed)
    consumed = clips_read(first_job, SAVE_AFTER)
    assert len(consumed) == 2 * SAVE_AFTER * B
    rest = clips_read(resumed)
    keys = [key for key, _, _ in consumed + rest]
    assert len(keys) == len(set(keys)), "no clip twice across the resume"
    for key, indices, digest in rest:
        assert (indices, digest) == one_process[key], key
    remainder = {r["remainder_clips"] for r in resumed}
    assert len(remainder) == 1, remainder
    (left,) = remainder
    assert len(keys) + left == CLIPS and left < 3 * B, "every clip read once, or in the remainder"
    assert len(set(one_process) - set(keys)) == left


def frame_times(path: str) -> list[float]:
    """Every frame's presentation time, in presentation order, as ffprobe reads them."""
    ffprobe = os.path.join(os.path.dirname(video_clips.ffmpeg_cli()), "ffprobe")
    cmd = [ffprobe, "-v", "error", "-select_streams", "v:0", "-show_entries", "frame=pts_time", "-of", "json"]
    out = subprocess.run([*cmd, path], check=True, capture_output=True, text=True, timeout=60).stdout
    return sorted(float(f["pts_time"]) for f in json.loads(out)["frames"])


@pytest.fixture(scope="module")
def vfr_clip(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("vfr"))
    return video_clips.make_clip(d, seconds=2.0, size=(320, 240), fps="30", select=VFR_SELECT)


@pytest.mark.timeout(120)
def test_a_variable_frame_rate_clip_is_sampled_by_frame_number_as_torchcodec_numbers_frames(
    vfr_clip, tmp_path
):
    times = frame_times(vfr_clip)
    gaps = np.diff(times)
    # Frames 0-29 a 30th of a second apart, frame 32 next (30 and 31 dropped), then every 4th.
    assert len(times) == 30 + 7, times
    assert np.allclose(gaps[:29], 1 / 30, atol=1e-3) and np.allclose(gaps[30:], 4 / 30, atol=1e-3), gaps
    assert gaps[29] == pytest.approx(3 / 30, abs=1e-3), "really uneven timestamps"

    decoder = VideoDecoder(vfr_clip, seek_mode="exact")
    n = decoder.metadata.num_frames
    assert n == len(times)
    every = decoder.get_frames_at(list(range(n)))
    assert np.allclose(every.pts_seconds.numpy(), times, atol=1e-4), "TorchCodec numbers frames in time order"
    reference = every.data.numpy().astype(np.int16)
    neighbours = np.abs(np.diff(reference, axis=0)).mean(axis=(1, 2, 3))
    assert neighbours.min() > 5, "every frame differs from the next: a frame one off shows"
    data = read(vfr_clip)
    for indices in (list(range(n)), [36, 0, 30, 29, 31, 5, 5, 33]):
        decoded = video.decode_frames(data, indices)
        assert decoded.info.frames == n
        assert np.array_equal(decoded.frames, every.data.numpy()[indices]), indices

    # The loader: frames spread over the frame numbers, as TorchCodec's reference spreads them.
    shard = write_file(str(tmp_path / "vfr.tar"), tar_bytes([("pan.mp4", data), ("pan.txt", b"a pan")]))
    frames, size = 8, 64
    (batch,) = VideoLoader(count_clips(shard, threads=1), batch_size=1, frames=frames, size=size, threads=1)
    indices, expected = reference_clip(vfr_clip, frames, size)
    assert batch.indices[0].tolist() == indices == [0, 5, 10, 15, 21, 26, 31, 36]
    got = batch.frames[0].numpy().astype(np.int16)
    error = np.abs(got - expected.astype(np.int16))
    # Pillow's bicubic against torchvision's, on the same decoded frames (test_video.py's bounds).
    assert error.mean() < 0.5 and error.max() <= 16, (error.mean(), error.max())
    # By frame number, not by time: the dense first second (30 of the 37 frames, 1.0 of 1.9 s)
    # holds 6 of the 8 frames sampled, about 1/6 s apart there, the last two 2/3 s apart.
    sampled = np.array([times[i] for i in indices])
    assert int((sampled < 1.0).sum()) == 6
    assert np.diff(sampled).max() > 3 * np.diff(sampled).min()
