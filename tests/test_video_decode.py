"""A clip's sampled frames decoded through the system's FFmpeg (issue 54): compared with the
decoders users have today on clips FFmpeg's CLI makes from real photos (tests/video_clips.py).

* PyAV (its own bundled FFmpeg) and TorchCodec 0.17 (the system's) at the same frame numbers:
  8-bit clips of H.264 (High, B-frames), HEVC, VP9 and AV1 in MP4, WebM and MKV give the same
  pixels, and 10-bit HEVC within 1 level on average;
* rotation metadata applied as TorchCodec and FFmpeg's CLI apply it;
* the Qwen path end to end: qwen-vl-utils' frames, resized to ``smart_resize``'s size, against
  TorchCodec's frames resized by torchvision's bicubic (the resize qwen-vl-utils runs);
* every bad clip a typed reason, and decoding stopping after the last sampled frame.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import video_clips
from shardstream import video
from shardstream.errors import SampleError

av = pytest.importorskip("av", reason="requirements/video.txt (scripts/env.sh installs it)")
torchcodec = pytest.importorskip("torchcodec", reason="requirements/video.txt")
from torchcodec.decoders import VideoDecoder  # noqa: E402


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("clips"))


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def pyav_frames(path: str) -> list[np.ndarray]:
    """Every frame, [3, height, width] as ours."""
    with av.open(path) as container:
        return [f.to_ndarray(format="rgb24").transpose(2, 0, 1) for f in container.decode(video=0)]


def torchcodec_frames(path: str, indices: list[int]) -> np.ndarray:
    return VideoDecoder(path).get_frames_at(indices).data.numpy()


def mean_error(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def assert_each_is_its_frame(ours: np.ndarray, reference: list[np.ndarray], indices: list[int]):
    """Each decoded frame is nearest to the reference's frame of its number, not a neighbour's
    (the pan moves every frame): a frame taken one off fails here whatever the tolerance."""
    for frame, n in zip(ours, indices, strict=True):
        errors = {m: mean_error(frame, reference[m]) for m in (n - 1, n, n + 1) if 0 <= m < len(reference)}
        assert min(errors, key=errors.get) == n, (n, errors)


ENCODINGS = [
    pytest.param(dict(codec="h264"), id="h264-mp4"),
    pytest.param(dict(codec="h264", fps="30000/1001", gop=12, audio=True), id="h264-29.97-gop12-audio"),
    pytest.param(dict(codec="h264", fps="60", size=(640, 360), container="mov"), id="h264-60-mov"),
    pytest.param(dict(codec="hevc", fps="24"), id="hevc-24"),
    pytest.param(dict(codec="vp9", container="webm", audio=True), id="vp9-webm-audio"),
    pytest.param(dict(codec="av1", container="mkv"), id="av1-mkv"),
    # Rows that are not a whole number of swscale's vectors: its RGB output overran a buffer of
    # exactly the frame's bytes and corrupted the heap (the process aborted).
    pytest.param(dict(codec="h264", size=(120, 176), seconds=1.0), id="h264-120x176-portrait"),
    pytest.param(dict(codec="vp9", container="webm", size=(98, 74)), id="vp9-98x74"),
]


def test_mpeg_ts_frames_equal_pyav(clips: str) -> None:
    """MPEG-TS, whose streams are found while its packets are read rather than from a header:
    the container is opened a second time for its packets without probing them, and the probed
    parameters decode them. (TorchCodec 0.17 fails on this clip: "no more frames left".)"""
    path = video_clips.make_clip(clips, codec="h264", container="ts", audio=True)
    reference = pyav_frames(path)
    indices = [0, 1, 13, len(reference) // 2, len(reference) - 1]
    decoded = video.decode_frames(read(path), indices)
    assert mean_error(decoded.frames, np.stack([reference[n] for n in indices])) == 0.0
    assert_each_is_its_frame(decoded.frames, reference, indices)


@pytest.mark.parametrize("how", ENCODINGS)
def test_frames_equal_pyav_and_torchcodec_at_the_same_numbers(clips: str, how: dict) -> None:
    path = video_clips.make_clip(clips, **how)
    reference = pyav_frames(path)
    indices = [len(reference) - 1, 0, 1, 13, 13, len(reference) // 2]
    decoded = video.decode_frames(read(path), indices)
    assert decoded.frames.shape == (len(indices), *reference[0].shape)
    assert decoded.frames.shape[1] == 3
    expected = np.stack([reference[n] for n in indices])
    assert mean_error(decoded.frames, expected) == 0.0
    assert mean_error(decoded.frames, torchcodec_frames(path, indices)) == 0.0
    assert_each_is_its_frame(decoded.frames, reference, indices)
    assert 0 < decoded.frames_decoded <= len(reference)


def test_ten_bit_hevc_is_within_a_level_of_pyav(clips: str) -> None:
    # 10-bit sources go through another dither and rounding in each FFmpeg front end (PyAV
    # bundles FFmpeg 7's swscale): the same frames, a fraction of a level apart on average.
    path = video_clips.make_clip(clips, codec="hevc", pix_fmt="yuv420p10le")
    reference = pyav_frames(path)
    indices = [0, 10, 25, len(reference) - 1]
    decoded = video.decode_frames(read(path), indices)
    assert mean_error(decoded.frames, np.stack([reference[n] for n in indices])) < 1.0
    assert_each_is_its_frame(decoded.frames, reference, indices)


def test_decoding_stops_after_the_last_sampled_frame(clips: str) -> None:
    path = video_clips.make_clip(clips, codec="h264", seconds=4.0)
    decoded = video.decode_frames(read(path), [3, 9])
    assert decoded.frames_decoded <= 10
    assert decoded.info.frames == 100
    assert video.decode_frames(read(path), []).frames.shape == (0, 3, 240, 320)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_only_the_packets_sampled_frames_need_are_decoded(clips: str, codec: str) -> None:
    """Short GOPs with B-frames: each sampled frame is decoded from the keyframe before it, and
    unsampled non-reference frames are skipped; the frames are still TorchCodec's."""
    path = video_clips.make_clip(clips, codec=codec, fps="60", seconds=6.0, gop=30)
    data = read(path)
    info = video.probe(data)
    sampled = video.sample_frames(info.frames, info.fps)
    decoded = video.decode_frames(data, sampled.indices)
    assert mean_error(decoded.frames, torchcodec_frames(path, sampled.indices)) == 0.0
    # 12 frames of 360: measured 109 decoded (every frame to the last would be 360).
    assert len(sampled.indices) == 12
    assert decoded.frames_decoded < info.frames // 3
    # Every frame in turn, against the frames decoded in order: the plan never starts a frame
    # from the wrong keyframe.
    every = pyav_frames(path)
    for n in range(0, info.frames, 7):
        one = video.decode_frames(data, [n])
        assert mean_error(one.frames[0], every[n]) == 0.0, n
        assert one.frames_decoded <= 30


def test_a_stream_without_timestamps_is_decoded_in_order(clips: str, tmp_path) -> None:
    """A raw H.264 elementary stream has no presentation times: frames are numbered in the
    order the decoder outputs them, every one decoded up to the last sampled."""
    raw = tmp_path / "clip.h264"
    subprocess.run(
        [video_clips.ffmpeg_cli(), "-nostdin", "-v", "error", "-i", video_clips.make_clip(clips)]
        + ["-c", "copy", "-bsf:v", "h264_mp4toannexb", "-f", "h264", str(raw)],
        check=True,
        timeout=60,
    )
    reference = pyav_frames(video_clips.make_clip(clips))
    decoded = video.decode_frames(raw.read_bytes(), [4, 20, 33])
    assert mean_error(decoded.frames, np.stack([reference[n] for n in (4, 20, 33)])) == 0.0
    assert decoded.frames_decoded == 34


@pytest.mark.parametrize("rotate", [90, 180, 270])
def test_rotation_is_applied_as_torchcodec_and_the_cli_apply_it(clips: str, rotate: int) -> None:
    path = video_clips.make_clip(clips, rotate=rotate)
    indices = [2, 30]
    decoded = video.decode_frames(read(path), indices)
    turned = rotate % 180 == 90
    assert (decoded.info.width, decoded.info.height) == ((240, 320) if turned else (320, 240))
    # FFmpeg 5.1's muxer writes the `rotate` tag as a counter-clockwise display matrix: the
    # frames are turned the other way, clockwise, to be displayed.
    assert decoded.info.rotation == (360 - rotate) % 360
    assert decoded.frames.shape == (2, 3, decoded.info.height, decoded.info.width)
    assert mean_error(decoded.frames, torchcodec_frames(path, indices)) == 0.0
    cli = subprocess.run(
        [video_clips.ffmpeg_cli(), "-nostdin", "-v", "error", "-i", path]
        + ["-vf", "select='eq(n\\,2)+eq(n\\,30)'", "-vsync", "0"]
        + ["-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    shape = (2, decoded.info.height, decoded.info.width, 3)
    cli_frames = np.frombuffer(cli, np.uint8).reshape(shape).transpose(0, 3, 1, 2)
    assert mean_error(decoded.frames, cli_frames) == 0.0


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(dict(size=(640, 360)), id="640x360"),
        pytest.param(dict(size=(1280, 720), seconds=1.0), id="1280x720"),
        pytest.param(dict(size=(320, 240), fps="60", gop=30), id="320x240-60"),
        pytest.param(dict(size=(320, 240), rotate=90), id="320x240-turned"),
    ],
)
def test_the_qwen_path_end_to_end(clips: str, how: dict) -> None:
    """qwen-vl-utils' frames at smart_resize's size: ours (the image kinds' Pillow bicubic on
    FFmpeg's RGB) against TorchCodec's RGB frames resized by torchvision's antialiased bicubic,
    which is what qwen-vl-utils' fetch_video runs. Measured: mean errors 0.12-0.14 levels, at
    most 8 at a pixel (float against 16-bit fixed-point weights); the bounds are 0.25 and 12."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    path = video_clips.make_clip(clips, **how)
    data = read(path)
    info = video.probe(data)
    sampled = video.sample_frames(info.frames, info.fps)
    size = video.frame_size(info.height, info.width, len(sampled.indices))
    decoded = video.decode_frames(data, sampled.indices, size=(size.height, size.width))
    frames = VideoDecoder(path).get_frames_at(sampled.indices).data
    reference = F.resize(
        frames, [size.height, size.width], interpolation=InterpolationMode.BICUBIC, antialias=True
    )
    assert decoded.frames.shape == tuple(reference.shape)
    assert mean_error(decoded.frames, reference.numpy()) < 0.25
    assert np.abs(decoded.frames.astype(np.int16) - reference.numpy()).max() <= 12


def test_probe_reads_the_header(clips: str) -> None:
    mp4 = video.probe(read(video_clips.make_clip(clips, fps="30000/1001", seconds=2.0)))
    assert (mp4.codec, mp4.width, mp4.height, mp4.rotation, mp4.frames) == ("h264", 320, 240, 0, 60)
    assert mp4.fps == pytest.approx(30000 / 1001)
    assert mp4.seconds == pytest.approx(2.002, abs=0.01)
    webm = video.probe(read(video_clips.make_clip(clips, codec="vp9", container="webm", audio=True)))
    # WebM states no frame count (transformers' PyAV reader divides by it); the duration stands.
    assert (webm.codec, webm.frames) == ("vp9", 0)
    assert webm.seconds == pytest.approx(2.0, abs=0.05)


def reason_of(call) -> tuple[str, str]:
    with pytest.raises(SampleError) as caught:
        call()
    return caught.value.reason, caught.value.detail


def test_bad_clips_are_typed_reasons(clips: str, tmp_path) -> None:
    good = read(video_clips.make_clip(clips, seconds=4.0))
    # Not a container at all.
    assert reason_of(lambda: video.probe(b"this is a caption, not a video" * 10))[0] == "corrupt_video"
    assert reason_of(lambda: video.probe(b""))[0] == "corrupt_video"
    # The moov box (at the end, as FFmpeg writes it by default) cut off.
    assert reason_of(lambda: video.probe(good[: len(good) // 2]))[0] == "corrupt_video"
    # The media data cut, the moov box first (re-muxed with +faststart): the header promises
    # 100 frames, fewer decode.
    fast = read(video_clips.make_clip(clips, seconds=4.0, size=(320, 248)))
    moov_first = tmp_path / "fast.mp4"
    src = tmp_path / "src.mp4"
    src.write_bytes(fast)
    subprocess.run(
        [video_clips.ffmpeg_cli(), "-nostdin", "-v", "error", "-i", str(src), "-c", "copy"]
        + ["-movflags", "+faststart", str(moov_first)],
        check=True,
        timeout=60,
    )
    cut = moov_first.read_bytes()[: len(moov_first.read_bytes()) * 6 // 10]
    assert video.probe(cut).frames == 100
    # Frames before the cut still decode; one after it is the clip's fault, named.
    assert video.decode_frames(cut, [0, 10]).frames_decoded <= 11
    assert reason_of(lambda: video.decode_frames(cut, [0, 99]))[0] == "corrupt_video"
    # A frame past the end of a whole clip.
    reason, detail = reason_of(lambda: video.decode_frames(good, [100]))
    assert reason == "corrupt_video" and "after 100 decoded frames" in detail
    # Audio only.
    audio = tmp_path / "tone.m4a"
    subprocess.run(
        [video_clips.ffmpeg_cli(), "-nostdin", "-v", "error", "-f", "lavfi"]
        + ["-i", "sine=frequency=440:duration=1", "-c:a", "aac", str(audio)],
        check=True,
        timeout=60,
    )
    assert reason_of(lambda: video.probe(audio.read_bytes()))[0] == "no_video_stream"
    # Caps, from the header, before decoding.
    reason, detail = reason_of(lambda: video.decode_frames(good, [0], max_pixels=320 * 240 - 1))
    assert reason == "too_many_pixels" and "320x240" in detail
    reason, detail = reason_of(lambda: video.probe(good, max_seconds=3.5))
    assert reason == "video_too_long" and "max_seconds=3.5" in detail
    assert video.probe(good, max_pixels=320 * 240, max_seconds=4.0).frames == 100


def test_bad_arguments_name_themselves(clips: str) -> None:
    good = read(video_clips.make_clip(clips))
    with pytest.raises(ValueError, match="indices"):
        video.decode_frames(good, [-1])
    with pytest.raises(ValueError, match="size"):
        video.decode_frames(good, [0], size=(0, 10))
    with pytest.raises(ValueError, match="max_seconds"):
        video.probe(good, max_seconds=-1.0)


def test_clips_decode_in_parallel_threads(clips: str) -> None:
    """The GIL is released while decoding: threads decoding clips at once give each its frames."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [video_clips.make_clip(clips, codec=c) for c in ("h264", "hevc")]
    datas = [read(p) for p in paths]
    alone = [video.decode_frames(d, [5, 40]).frames for d in datas]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: video.decode_frames(datas[i % 2], [5, 40]).frames, range(8)))
    for i, frames in enumerate(together):
        assert np.array_equal(frames, alone[i % 2])
