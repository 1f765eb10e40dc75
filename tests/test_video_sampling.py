"""The video kind's frame sampling and frame sizes (issue 54) against the real references, case
by case over a grid: ``qwen-vl-utils`` 0.0.14 (its ``calculate_video_frame_range``,
``smart_nframes`` and the ``torch.linspace(first, last, n).round()`` its TorchCodec and decord
readers pick frames with; ``smart_resize`` under ``fetch_video``'s pixel budgets) and
transformers' ``Qwen2VLVideoProcessor`` (``sample_frames``, and its resize and grid with
``cap_pixels_per_frame``). Indices and sizes must be identical; a case a reference refuses must be
refused here too, with a ``ValueError``.

The frame numbers are torch's float32 arithmetic: ``linspace``'s AVX2 and AVX-512 kernels and
``arange``'s AVX2 and default kernels (rust/src/batch/video/sampling.rs); a comparison torch's
kernel on this machine computes otherwise is skipped, saying so.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
vp = pytest.importorskip("qwen_vl_utils.vision_process")
transformers = pytest.importorskip("transformers")

from shardstream import video  # noqa: E402
from transformers import Qwen2VLVideoProcessor  # noqa: E402
from transformers.models.qwen2_vl import video_processing_qwen2_vl as tvp  # noqa: E402
from transformers.video_utils import VideoMetadata  # noqa: E402

CAPABILITY = torch.backends.cpu.get_cpu_capability()

# 24, 25, 29.97 (NTSC, 30000/1001) and 60 frames a second.
RATES = [24.0, 25.0, 30000 / 1001, 60.0]
# 1 s to 10 min.
SECONDS = [1, 2, 3.5, 7, 10, 30, 61, 120, 300, 600]
# How many frames: None is each reference's default (2 a second within 4..768).
COUNTS = [
    {},
    {"fps": 1.0},
    {"fps": 0.5},
    {"fps": 4.0},
    {"min_frames": 5, "max_frames": 101},
    {"min_frames": 4, "max_frames": 16},
    {"min_frames": 1, "max_frames": 7},
    {"fps": 3.0, "min_frames": 9, "max_frames": 33},
    {"nframes": 2},
    {"nframes": 4},
    {"nframes": 7},
    {"nframes": 8},
    {"nframes": 31},
    {"nframes": 64},
]


def times(duration: float) -> list[tuple[float | None, float | None]]:
    """(video_start, video_end) pairs of a clip of ``duration`` seconds: none, one, both, and
    times outside the clip (clamped)."""
    return [
        (None, None),
        (0.5, None),
        (None, duration - 0.3),
        (1.25, duration / 2),
        (duration * 0.3, duration * 0.7),
        (-2.0, duration + 5.0),
    ]


def clips() -> list[tuple[int, float]]:
    """(total_frames, video_fps): every rate and length, and a frame either side."""
    out = []
    for fps, seconds in itertools.product(RATES, SECONDS):
        frames = round(seconds * fps)
        out += [(frames - 1, fps), (frames, fps), (frames + 1, fps)]
    return out


def qwen_reference(total: int, fps: float, count: dict, start, end) -> tuple[list[int], int, float]:
    """qwen-vl-utils' TorchCodec and decord readers, line for line (minus the decoding)."""
    ele = dict(count)
    if start is not None:
        ele["video_start"] = start
    if end is not None:
        ele["video_end"] = end
    first, last, range_frames = vp.calculate_video_frame_range(ele, total, fps)
    nframes = vp.smart_nframes(ele, total_frames=range_frames, video_fps=fps)
    idx = torch.linspace(first, last, nframes).round().long().tolist()
    sample_fps = nframes / max(range_frames, 1e-6) * fps
    return idx, range_frames, sample_fps


PROCESSOR = Qwen2VLVideoProcessor()


def transformers_reference(total: int, fps: float, count: dict, start, end) -> list[int]:
    """``Qwen2VLVideoProcessor.sample_frames`` over the range qwen-vl-utils' times give (it takes
    no times itself), numbered from the range's first frame."""
    ele = {k: v for k, v in (("video_start", start), ("video_end", end)) if v is not None}
    first, _, range_frames = vp.calculate_video_frame_range(ele, total, fps)
    metadata = VideoMetadata(total_num_frames=range_frames, fps=fps)
    indices = PROCESSOR.sample_frames(
        metadata,
        temporal_patch_size=2,
        min_frames=count.get("min_frames", 4),
        max_frames=count.get("max_frames", 768),
        num_frames=count.get("nframes"),
        fps=None if "nframes" in count else count.get("fps", 2.0),
    )
    return [first + int(i) for i in indices]


def ours(total: int, fps: float, count: dict, start, end, rule: str) -> video.SampledFrames:
    return video.sample_frames(total, fps, rule=rule, video_start=start, video_end=end, **count)


def cases():
    for (total, fps), count in itertools.product(clips(), COUNTS):
        for start, end in times(total / fps):
            yield total, fps, count, start, end


def test_the_grid_is_wide():
    n = sum(1 for _ in cases())
    assert n > 10_000, n


def compare_to(reference, refusals, rule: str) -> tuple[int, int]:
    """Over the grid, our frames for ``rule`` against ``reference``'s (indices, or (indices,
    range_frames, sample_fps)); where it raises one of ``refusals``, ours must raise ValueError.
    (compared, refused)."""
    compared = refused = 0
    for total, fps, count, start, end in cases():
        where = f"total_frames={total} video_fps={fps} {count} video_start={start} video_end={end}"
        try:
            expected = reference(total, fps, count, start, end)
        except refusals:
            with pytest.raises(ValueError):
                ours(total, fps, count, start, end, rule)
            refused += 1
            continue
        got = ours(total, fps, count, start, end, rule)
        if isinstance(expected, tuple):
            indices, range_frames, sample_fps = expected
            assert got.range_frames == range_frames, where
            assert got.sample_fps == pytest.approx(sample_fps, rel=1e-12), where
        else:
            indices = expected
        assert got.indices == indices, where
        compared += 1
    return compared, refused


@pytest.mark.skipif(
    CAPABILITY not in ("AVX2", "AVX512"),
    reason=f"torch.linspace's {CAPABILITY} kernel rounds twice (no FMA), AVX2 and AVX-512 once",
)
def test_frames_are_qwen_vl_utils_frames():
    compared, refused = compare_to(qwen_reference, ValueError, "qwen-vl-utils")
    assert compared > 9_000 and refused > 0, (compared, refused)


@pytest.mark.skipif(
    CAPABILITY not in ("AVX2", "DEFAULT"),
    reason=f"torch.arange's {CAPABILITY} kernel fills 16 lanes: not the 8 of AVX2 these frames are",
)
def test_frames_are_transformers_frames():
    # ZeroDivisionError: a count of 0 frames, which transformers divides by.
    compared, refused = compare_to(transformers_reference, (ValueError, ZeroDivisionError), "transformers")
    assert compared > 9_000 and refused > 0, (compared, refused)


def test_the_rules_differ_only_in_which_frames():
    """Same count (the min_frames rounding aside), qwen-vl-utils ends on the range's last frame,
    transformers up to one step short of it."""
    for total, fps in [(3600, 60.0), (round(600 * 30000 / 1001), 30000 / 1001), (241, 24.0)]:
        q = video.sample_frames(total, fps)
        t = video.sample_frames(total, fps, rule="transformers")
        assert len(q.indices) == len(t.indices)
        assert q.indices[0] == t.indices[0] == 0
        assert q.indices[-1] == total - 1
        step = total / len(t.indices)
        assert total - 1 - step <= t.indices[-1] < total - 1


def test_clip_frames_spread_first_to_last_as_linspace():
    for (total, fps), t in itertools.product(clips()[::5], [1, 2, 8, 16, 32]):
        for start, end in times(total / fps)[:4]:
            ele = {k: v for k, v in (("video_start", start), ("video_end", end)) if v is not None}
            try:
                first, last, range_frames = vp.calculate_video_frame_range(ele, total, fps)
            except ValueError:
                with pytest.raises(ValueError):
                    video.clip_frames(total, fps, t, video_start=start, video_end=end)
                continue
            got = video.clip_frames(total, fps, t, video_start=start, video_end=end)
            assert got.indices == torch.linspace(first, last, t).round().long().tolist()
            assert got.range_frames == range_frames
    # A range shorter than T repeats frames.
    assert video.clip_frames(3, 30.0, 5).indices == [0, 0, 1, 2, 2]


def test_variable_frame_rate_spreads_frame_numbers_not_timestamps():
    """10 s of which the first 5 s are at 60 fps and the last 5 s at 15: 375 frames, an average
    37.5 fps. Frames are spread over frame numbers, as both references spread them: 4 of every
    5 fall in the first half of the time."""
    got = video.sample_frames(375, 37.5)
    assert len(got.indices) == 20
    assert got.indices == qwen_reference(375, 37.5, {}, None, None)[0]
    first_half = sum(1 for i in got.indices if i < 300)
    assert first_half == 16


# Frame sizes -------------------------------------------------------------------------------

SIDES = [240, 320, 360, 480, 540, 576, 720, 1080, 1280, 1920]
EXTREME = [
    (10, 2000),
    (2000, 10),
    (16, 3200),
    (3200, 16),
    (20, 4001),
    (28, 5600),
    (100, 20000),
    (1, 200),
    (64, 8000),
]
NFRAMES = [1, 2, 4, 16, 17, 20, 64, 128, 300, 768]
BUDGETS = [
    {},
    {"max_pixels": 200_000},
    {"min_pixels": 50_000},
    {"total_pixels": 20_000_000},
    {"min_pixels": 200_704, "max_pixels": 1_000_000},
    {"max_pixels": 50_000},  # under min_pixels: refused
]


def qwen_size(height: int, width: int, nframes: int, budget: dict, patch_size: int):
    """``fetch_video``'s budget lines for ``nframes`` frames (qwen_vl_utils/vision_process.py,
    the lines after the reader returns), then its real ``smart_resize``."""
    image_factor = patch_size * vp.SPATIAL_MERGE_SIZE
    video_frame_min_pixels = vp.VIDEO_MIN_TOKEN_NUM * image_factor * image_factor
    video_frame_max_pixels = vp.VIDEO_MAX_TOKEN_NUM * image_factor * image_factor
    min_pixels = budget.get("min_pixels", video_frame_min_pixels)
    total_pixels = budget.get("total_pixels", vp.MODEL_SEQ_LEN * image_factor * image_factor * 0.9)
    max_pixels = max(
        min(video_frame_max_pixels, total_pixels / nframes * vp.FRAME_FACTOR), int(min_pixels * 1.05)
    )
    max_pixels = min(budget.get("max_pixels", max_pixels), max_pixels)
    return vp.smart_resize(height, width, factor=image_factor, min_pixels=min_pixels, max_pixels=max_pixels)


def size_cases():
    sizes = [(h, w) for h, w in itertools.product(SIDES, SIDES)] + EXTREME
    for (h, w), n, budget, patch in itertools.product(sizes, NFRAMES, BUDGETS, [14, 16]):
        yield h, w, n, budget, patch


@pytest.mark.skipif(vp.MODEL_SEQ_LEN != 128_000, reason="MODEL_SEQ_LEN is set in the environment")
def test_frame_sizes_are_qwen_vl_utils_sizes():
    compared = refused = 0
    for h, w, n, budget, patch in size_cases():
        where = f"{h}x{w} nframes={n} {budget} patch_size={patch}"
        factor = patch * 2
        try:
            expected = qwen_size(h, w, n, budget, patch)
        except (ValueError, AssertionError):
            # ValueError: an aspect over 200; AssertionError: max_pixels under min_pixels.
            with pytest.raises(ValueError):
                video.frame_size(h, w, n, patch_size=patch, **budget)
            refused += 1
            continue
        if min(expected) < factor:
            # A side floored to 0: the reference hands it to its resize, which fails.
            with pytest.raises(ValueError):
                video.frame_size(h, w, n, patch_size=patch, **budget)
            refused += 1
            continue
        got = video.frame_size(h, w, n, patch_size=patch, **budget)
        assert (got.height, got.width) == expected, where
        assert got.grid_thw == (math.ceil(n / 2), expected[0] // patch, expected[1] // patch), where
        compared += 1
    assert compared > 5_000 and refused > 0, (compared, refused)


def test_frame_sizes_are_the_transformers_processors():
    """transformers' own resize with ``cap_pixels_per_frame`` (qwen-vl-utils' budget), its
    ``smart_resize`` under the budget its ``resize`` computes, over the ordinary sizes; it divides
    the total budget in integers and holds a side at one merge block after the budget, not
    before, so the extreme aspects are qwen-vl-utils' alone."""
    size = PROCESSOR.size
    compared = 0
    for (h, w), n in itertools.product(itertools.product(SIDES, SIDES), NFRAMES):
        factor = PROCESSOR.patch_size * PROCESSOR.merge_size
        total_pixels = int(PROCESSOR.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(size.longest_edge, total_pixels * 2 // n), int(size.shortest_edge * 1.05))
        expected = tvp.smart_resize(h, w, factor=factor, min_pixels=size.shortest_edge, max_pixels=max_pixels)
        got = video.frame_size(h, w, n)
        assert (got.height, got.width) == expected, f"{h}x{w} nframes={n}"
        compared += 1
    assert compared == len(SIDES) ** 2 * len(NFRAMES)


@pytest.mark.parametrize(
    ("frames", "height", "width"), [(4, 240, 320), (5, 360, 640), (20, 1080, 1920), (3, 1920, 1080)]
)
def test_the_processor_resizes_and_grids_a_real_clip_alike(frames, height, width):
    """The real processor on a clip of ``frames`` frames: its ``video_grid_thw`` is the grid
    here (the frames padded to whole temporal patches)."""
    clip = torch.zeros((frames, 3, height, width), dtype=torch.uint8)
    out = PROCESSOR(videos=[clip], do_sample_frames=False, cap_pixels_per_frame=True, return_tensors="pt")
    got = video.frame_size(height, width, frames)
    assert tuple(out["video_grid_thw"][0].tolist()) == got.grid_thw


# Bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: video.sample_frames(0, 30.0), "total_frames"),
        (lambda: video.sample_frames(-5, 30.0), "total_frames"),
        (lambda: video.sample_frames(300, 0.0), "video_fps"),
        (lambda: video.sample_frames(300, -25.0), "video_fps"),
        (lambda: video.sample_frames(300, float("nan")), "video_fps"),
        (lambda: video.sample_frames(300, 30.0, fps=0.0), "fps"),
        (lambda: video.sample_frames(300, 30.0, fps=-2.0), "fps"),
        (lambda: video.sample_frames(300, 30.0, video_start=6.0, video_end=4.0), "video_end"),
        (lambda: video.sample_frames(300, 30.0, video_start=6.0, video_end=4.0), "video_start"),
        (lambda: video.sample_frames(300, 30.0, video_end=float("inf")), "video_end"),
        (lambda: video.sample_frames(300, 30.0, fps=1.0, nframes=4), "nframes"),
        (lambda: video.sample_frames(300, 30.0, nframes=400), "nframes"),
        (lambda: video.sample_frames(300, 30.0, nframes=-1), "nframes"),
        (lambda: video.sample_frames(300, 30.0, min_frames=-1), "min_frames"),
        (lambda: video.sample_frames(300, 30.0, temporal_patch_size=0), "temporal_patch_size"),
        (lambda: video.sample_frames(300, 30.0, rule="uniform"), "rule"),  # type: ignore[arg-type]
        (lambda: video.clip_frames(300, 30.0, 0), "num_frames"),
        (lambda: video.clip_frames(0, 30.0, 8), "total_frames"),
        (lambda: video.clip_frames(300, 0.0, 8), "video_fps"),
        (lambda: video.frame_size(480, 640, 0), "nframes"),
        (lambda: video.frame_size(0, 640, 4), "height"),
        (lambda: video.frame_size(10, 2001, 4), "width"),
        (lambda: video.frame_size(480, 640, 4, min_pixels=-1), "min_pixels"),
        (lambda: video.frame_size(480, 640, 4, max_pixels=50_000), "max_pixels"),
        (lambda: video.frame_size(480, 640, 4, patch_size=0), "patch_size"),
        (lambda: video.frame_size(-480, 640, 4), "height"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()
