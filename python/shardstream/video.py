"""Which frames of a video clip are read, and the size they are resized to (issue 54).

The first slice of the video kind: pure computation from a clip's frame count, average frame
rate and size, before anything is decoded. The frames and sizes are those of the references,
bit for bit (``tests/test_video_sampling.py`` checks them against the installed libraries):

* :func:`sample_frames`: the frames of a clip for the Qwen2-VL video path. The default rule,
  ``"qwen-vl-utils"``, is ``qwen-vl-utils`` 0.0.14's ``fetch_video`` (Qwen's own pipeline, the
  one its models were trained with): ``smart_nframes`` frames spread by
  ``linspace(first, last, n).round()`` from the first frame of the clip (or of its
  ``video_start``..``video_end`` range) to its last. ``"transformers"`` is transformers'
  ``Qwen2VLVideoProcessor.sample_frames``: the same number of frames (except for an odd
  ``min_frames``, which qwen-vl-utils rounds up to the temporal patch first) by equal steps
  ``arange(0, total, total / n)`` from the first frame, which stops up to one step short of the
  last.
* :func:`clip_frames`: ``num_frames`` frames spread first to last, for a video-text CLIP clip.
* :func:`frame_size`: the size every sampled frame is resized to on the Qwen path
  (qwen-vl-utils' ``smart_resize`` under its per-frame and total pixel budgets), and the clip's
  patch grid.

Frames are picked by frame number, as both references pick them: the frame rate is the clip's
average (frames / duration), times convert to frame numbers at that rate, and frames are spread
evenly over the frame numbers. On a variable-frame-rate clip that spreads them evenly over the
frames, not over time: a stretch recorded at a higher rate gets more of them.

:func:`decode_frames` decodes a clip's sampled frames from its bytes, and :func:`probe` reads
its stream header, through the system's FFmpeg (5.x; found at run time, never bundled: see the
video guide). The CLIP clip batches are :class:`shardstream.VideoLoader`'s; the Qwen path's
rows are not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from shardstream import _core
from shardstream.errors import SampleError

__all__ = [
    "DecodedFrames",
    "FfmpegUnavailable",
    "FrameSize",
    "SampledFrames",
    "VideoInfo",
    "clip_frames",
    "decode_frames",
    "frame_size",
    "probe",
    "sample_frames",
]

#: Raised when no usable FFmpeg is found (an ``ImportError``): install the system's FFmpeg 5
#: libraries (Debian/Ubuntu: ``apt install ffmpeg``).
FfmpegUnavailable = _core.FfmpegUnavailable

#: The default cap on one coded frame's pixels (the image kinds' ``max_pixels``).
MAX_PIXELS: int = _core.DEFAULTS["max_pixels"]

Rule = Literal["qwen-vl-utils", "transformers"]


@dataclass(frozen=True)
class SampledFrames:
    """The frames a clip is read at.

    Attributes:
        indices: The frame numbers, ascending, counted from the clip's first frame (a number
            repeats when :func:`clip_frames` asks for more frames than the range holds).
        range_frames: The frames of the range sampled from: all the clip's without
            ``video_start`` and ``video_end``.
        sample_fps: Sampled frames a second, ``len(indices) / range_frames * video_fps``, as both
            references compute it (qwen-vl-utils' ``sample_fps``, transformers'
            ``VideoMetadata.sampled_fps``); Qwen2.5-VL's ``second_per_grid_ts`` is
            ``temporal_patch_size / sample_fps``.
    """

    indices: list[int]
    range_frames: int
    sample_fps: float


@dataclass(frozen=True)
class FrameSize:
    """The size the sampled frames of a clip are resized to, and the clip's patch grid.

    Attributes:
        height: Every frame's resized height, a multiple of ``patch_size * merge_size``.
        width: Every frame's resized width, a multiple of ``patch_size * merge_size``.
        grid_thw: The clip's ``video_grid_thw``: temporal patches (the frames padded to whole
            temporal patches), rows and columns of patches.
    """

    height: int
    width: int
    grid_thw: tuple[int, int, int]


def sample_frames(
    total_frames: int,
    video_fps: float,
    *,
    rule: Rule = "qwen-vl-utils",
    fps: float | None = None,
    nframes: int | None = None,
    min_frames: int = 4,
    max_frames: int = 768,
    video_start: float | None = None,
    video_end: float | None = None,
    temporal_patch_size: int = 2,
) -> SampledFrames:
    """The frames the Qwen2-VL video path reads of a clip, by frame number.

    How many: ``nframes`` rounded to the temporal patch, or else ``fps`` frames a second of the
    range (2 when neither is given), at least ``min_frames`` and at most ``max_frames`` and the range's
    frames, rounded down to the temporal patch. Which: ``"qwen-vl-utils"`` (the default, Qwen's
    own pipeline) spreads them from the range's first frame to its last
    (``linspace(first, last, n).round()``); ``"transformers"`` steps from the range's first frame
    by ``range_frames / n`` (``arange``, truncated), which stops up to one step short of the
    last (transformers takes no clip times: here it samples the same range).

    Args:
        total_frames: The clip's frames.
        video_fps: The clip's average frame rate, frames / duration (TorchCodec's
            ``average_fps``, decord's ``get_avg_fps()``).
        rule: ``"qwen-vl-utils"`` or ``"transformers"``.
        fps: Frames a second to sample (qwen-vl-utils' ``fps``); not with ``nframes``.
        nframes: Frames to sample (qwen-vl-utils' ``nframes``, transformers' ``num_frames``).
        min_frames: The least frames ``fps`` samples.
        max_frames: The most frames ``fps`` samples.
        video_start: Where the range starts, in seconds (rounded up to a frame).
        video_end: Where the range ends, in seconds (rounded down to a frame).
        temporal_patch_size: Frames a temporal patch holds: the count is a multiple of it.

    Returns:
        The frames, the range's frame count and the sampled frames a second.

    Raises:
        ValueError: naming the argument: ``total_frames`` under 1, ``video_fps`` or ``fps`` not
            positive, ``video_end`` before ``video_start``, both ``fps`` and ``nframes``, or a
            count the range cannot hold.
    """
    indices, range_frames, sample_fps = _core.video_sample_frames(
        total_frames,
        video_fps,
        rule=rule,
        fps=fps,
        nframes=nframes,
        min_frames=min_frames,
        max_frames=max_frames,
        video_start=video_start,
        video_end=video_end,
        temporal_patch_size=temporal_patch_size,
    )
    return SampledFrames(indices, range_frames, sample_fps)


def clip_frames(
    total_frames: int,
    video_fps: float,
    num_frames: int,
    *,
    video_start: float | None = None,
    video_end: float | None = None,
) -> SampledFrames:
    """The ``num_frames`` frames of a video-text CLIP clip: spread from the first frame of its
    range to the last as the default rule of :func:`sample_frames` spreads them, with no
    temporal patch; a range of fewer frames repeats some.

    Args:
        total_frames: The clip's frames.
        video_fps: The clip's average frame rate (converts ``video_start`` and ``video_end``).
        num_frames: Frames a clip holds (its ``T``).
        video_start: Where the range starts, in seconds.
        video_end: Where the range ends, in seconds.

    Returns:
        The frames, the range's frame count and the sampled frames a second.

    Raises:
        ValueError: naming the argument: ``total_frames`` or ``num_frames`` under 1,
            ``video_fps`` not positive, ``video_end`` before ``video_start``.
    """
    indices, range_frames, sample_fps = _core.video_clip_frames(
        total_frames, video_fps, num_frames, video_start=video_start, video_end=video_end
    )
    return SampledFrames(indices, range_frames, sample_fps)


def frame_size(
    height: int,
    width: int,
    nframes: int,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: float | None = None,
    max_pixels: float | None = None,
    total_pixels: float | None = None,
) -> FrameSize:
    """The size every one of ``nframes`` sampled frames of a ``height x width`` clip is resized
    to on the Qwen path, and the clip's patch grid.

    qwen-vl-utils' ``fetch_video``: a frame gets at least ``min_pixels`` (128 merge blocks of
    ``patch_size * merge_size`` pixels a side) and at most the least of 768 merge blocks, its
    share of ``total_pixels`` (``total_pixels / nframes * temporal_patch_size``, never under
    ``1.05 * min_pixels``) and ``max_pixels``; its ``smart_resize`` then rounds the sides to
    multiples of ``patch_size * merge_size`` within that budget, keeping the aspect.

    Args:
        height: The clip's frame height.
        width: The clip's frame width.
        nframes: The sampled frames (``len(sample_frames(...).indices)``).
        patch_size: Pixels a patch side (14; Qwen3-VL's 16).
        merge_size: Patches a merge block side.
        temporal_patch_size: Frames a temporal patch.
        min_pixels: A frame's least pixels; None is 128 merge blocks.
        max_pixels: A cap under the frame's budget (it never raises it).
        total_pixels: The clip's pixels in all; None is 90% of 128,000 merge blocks
            (qwen-vl-utils' ``MODEL_SEQ_LEN``).

    Returns:
        The resized height and width and the ``(t, h, w)`` grid.

    Raises:
        ValueError: naming the argument: ``nframes`` under 1, an aspect over 200 or a side of
            0 (``height``, ``width``), a budget not positive or under ``min_pixels``.
    """
    h, w, grid = _core.video_frame_size(
        height,
        width,
        nframes,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        total_pixels=total_pixels,
    )
    return FrameSize(h, w, grid)


@dataclass(frozen=True)
class VideoInfo:
    """What a clip's stream header says, before any frame is decoded.

    Attributes:
        codec: FFmpeg's codec name ("h264", "hevc", "vp9", "av1").
        width: The displayed width (the coded size turned by ``rotation``).
        height: The displayed height.
        rotation: Clockwise degrees (0, 90, 180, 270) the frames are turned to be displayed,
            from the stream's display matrix; :func:`decode_frames` applies it, as FFmpeg's CLI
            and TorchCodec do.
        fps: The average frame rate: the ``video_fps`` :func:`sample_frames` takes.
        frames: The frame count the container states; 0 where it states none (WebM, MKV).
        seconds: The duration; 0.0 where the container states none.
    """

    codec: str
    width: int
    height: int
    rotation: int
    fps: float
    frames: int
    seconds: float


@dataclass(frozen=True)
class DecodedFrames:
    """A clip's sampled frames, decoded.

    Attributes:
        frames: ``uint8 [len(indices), 3, height, width]`` RGB (TorchCodec's layout, and the
            CLIP clips'), upright, in the order of the indices asked for.
        frames_decoded: Frames the decoder output: those asked for and the references they
            needed (skipped and dropped frames are not decoded): the work per frame sampled.
        info: The clip's header.
    """

    frames: np.ndarray
    frames_decoded: int
    info: VideoInfo


def _sample_error(fault: BaseException) -> SampleError:
    reason, url, key, detail = (str(a) for a in fault.args[:4])
    return SampleError(reason, url, key, detail)


def probe(data: bytes, *, max_pixels: int = MAX_PIXELS, max_seconds: float = 0.0) -> VideoInfo:
    """Reads a clip's stream header from its bytes (an MP4, MOV, WebM or MKV file, whole).

    Args:
        data: The file's bytes.
        max_pixels: The most pixels of a frame; a larger clip is refused from its header.
        max_seconds: The longest clip, from its header (0: no cap).

    Returns:
        Its :class:`VideoInfo`.

    Raises:
        SampleError: with ``reason`` ``corrupt_video`` (the container does not open or parse),
            ``no_video_stream``, ``unsupported_codec`` (named in the detail),
            ``too_many_pixels`` or ``video_too_long``.
        FfmpegUnavailable: no FFmpeg 5 shared libraries in this process.
    """
    try:
        info = _core.video_probe(data, max_pixels=max_pixels, max_seconds=max_seconds)
    except _core.CoreFault as fault:
        raise _sample_error(fault) from None
    return VideoInfo(**info)


def decode_frames(
    data: bytes,
    indices: list[int],
    *,
    size: tuple[int, int] | None = None,
    max_pixels: int = MAX_PIXELS,
    max_seconds: float = 0.0,
) -> DecodedFrames:
    """Decodes the frames ``indices`` of a clip from its bytes, and only the packets they need.

    Frame ``n`` is the frame with the ``n``-th smallest presentation time, counted from 0, as
    :func:`sample_frames` and TorchCodec number them. Each is decoded from the keyframe before
    it, skipping the unsampled non-reference frames between (a stream without distinct packet
    times is decoded in order up to the largest index). Only the frames asked for are
    converted: from the decoder's YUV (in the frame's own colour matrix and range)
    to RGB by FFmpeg's swscale at the coded size, turned upright, then resized to ``size`` by the
    image kinds' resize (Pillow's antialiased bicubic, which torchvision's antialiased resize in
    qwen-vl-utils follows). One decoder thread per call, the GIL released: decode clips in
    parallel from threads.

    Args:
        data: The file's bytes (an MP4, MOV, WebM or MKV file, whole).
        indices: Frame numbers, any order, repeats allowed.
        size: (height, width) of every output frame, upright; None keeps the displayed size.
        max_pixels: The most pixels of a coded frame, checked from the header and every frame.
        max_seconds: The longest clip, from its header (0: no cap).

    Returns:
        :class:`DecodedFrames`.

    Raises:
        SampleError: as :func:`probe`'s, and ``corrupt_video`` when a packet does not decode or
            the clip ends before an index (the detail says after how many frames).
        ValueError: a negative index, or a ``size`` side not positive.
        FfmpegUnavailable: no FFmpeg 5 shared libraries in this process.
    """
    try:
        pixels, height, width, decoded, info = _core.video_decode_frames(
            data, list(indices), size=size, max_pixels=max_pixels, max_seconds=max_seconds
        )
    except _core.CoreFault as fault:
        raise _sample_error(fault) from None
    frames = np.frombuffer(pixels, dtype=np.uint8).reshape(len(indices), 3, height, width)
    return DecodedFrames(frames, decoded, VideoInfo(**info))
