"""Test clips made from real photos by FFmpeg's own CLI (the Debian `ffmpeg` that
scripts/env.sh installs): a pan across a scikit-image photo, so that every frame differs from
its neighbours and a frame taken one off shows.

`make_clip(directory, **how)` writes one clip and returns its path; the same arguments give the
same file name, so a test session makes each clip once. `reference_clip(path, frames, size)` is
what a CLIP clip of that file should hold, by TorchCodec and torchvision.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import numpy as np

#: codec name -> (FFmpeg encoder, its options).
ENCODERS = {
    "h264": ("libx264", ["-profile:v", "high", "-preset", "veryfast", "-bf", "3"]),
    "hevc": ("libx265", ["-preset", "ultrafast", "-x265-params", "log-level=error:bframes=3"]),
    "vp9": ("libvpx-vp9", ["-deadline", "realtime", "-cpu-used", "8", "-b:v", "1M"]),
    "av1": ("libsvtav1", ["-preset", "12"]),
}


# SVT-AV1 prints its banner to stderr whatever FFmpeg's log level: errors only.
QUIET_ENCODERS = {**os.environ, "SVT_LOG": "1"}


def ffmpeg_cli() -> str:
    """The path of FFmpeg's CLI, or the test fails naming what installs it."""
    path = shutil.which("ffmpeg")
    if path is None:
        pytest.fail("the ffmpeg CLI is missing: scripts/env.sh installs Debian's ffmpeg")
    return path


def photo_path(name: str = "astronaut.png") -> str:
    import skimage

    return os.path.join(os.path.dirname(skimage.__file__), "data", name)


def make_clip(
    directory: str,
    *,
    codec: str = "h264",
    container: str = "mp4",
    fps: str = "25",
    seconds: float = 2.0,
    size: tuple[int, int] = (320, 240),
    gop: int = 250,
    pix_fmt: str = "yuv420p",
    rotate: int = 0,
    audio: bool = False,
    photo: str = "astronaut.png",
    select: str | None = None,
) -> str:
    """A clip of `seconds` at `fps` ("30000/1001" for 29.97), `size` = (width, height), panning
    across `photo` from its top-left to its bottom-right. `rotate` writes a display-matrix
    rotation (the frames stay as coded); `audio` adds a sine-tone AAC/Opus track. `select` keeps
    only the frames an FFmpeg ``select`` expression picks (``n`` counts the frames at `fps`),
    each at its own time (``-fps_mode vfr``): a variable-frame-rate clip."""
    how = repr((codec, container, fps, seconds, size, gop, pix_fmt, rotate, audio, photo))
    if select is not None:  # a new argument: the names of the clips made without it are kept
        how += repr(select)
    name = hashlib.sha256(how.encode()).hexdigest()[:16] + "." + container
    path = os.path.join(directory, name)
    if os.path.exists(path):
        return path
    width, height = size
    encoder, options = ENCODERS[codec]
    # The photo scaled to 1.5x the frame, a crop window moving corner to corner over the clip.
    pan = (
        f"scale={width * 3 // 2}:{height * 3 // 2},"
        f"crop={width}:{height}:x='(iw-{width})*t/{seconds}':y='(ih-{height})*t/{seconds}'"
    )
    cmd = [ffmpeg_cli(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]
    cmd += ["-loop", "1", "-framerate", fps, "-i", photo_path(photo)]
    if audio:
        cmd += ["-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}"]
    rate = ["-r", fps]
    if select is not None:
        pan += f",select='{select}'"
        rate = ["-fps_mode", "vfr"]
    cmd += ["-t", str(seconds), "-vf", pan, *rate, "-c:v", encoder, *options]
    cmd += ["-g", str(gop), "-pix_fmt", pix_fmt]
    if audio:
        cmd += ["-c:a", "libopus" if container in ("webm", "mkv") else "aac", "-shortest"]
    tmp = path + ".part." + container
    subprocess.run([*cmd, tmp], check=True, timeout=300, env=QUIET_ENCODERS)
    if rotate:
        # FFmpeg 5.1 writes a display matrix from the `rotate` tag only when remuxing.
        turned = path + ".turned." + container
        remux = [ffmpeg_cli(), "-nostdin", "-loglevel", "error", "-y", "-i", tmp, "-c", "copy"]
        remux += ["-metadata:s:v:0", f"rotate={rotate}", turned]
        subprocess.run(remux, check=True, timeout=120)
        os.replace(turned, tmp)
    os.replace(tmp, path)
    return path


def reference_clip(path: str, frames: int, size: int) -> tuple[list[int], np.ndarray]:
    """TorchCodec's frames at ``linspace(0, n - 1, frames).round()`` of its frame count, each
    centre-cropped to its shorter side and resized to ``size`` by torchvision's antialiased
    bicubic: the documented clip path, from the decoder PyTorch points users to."""
    import torch
    from torchcodec.decoders import VideoDecoder
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    decoder = VideoDecoder(path, seek_mode="exact")
    n = decoder.metadata.num_frames
    indices = torch.linspace(0, n - 1, frames).round().to(torch.int64).tolist()
    data = decoder.get_frames_at(indices).data
    side = min(data.shape[-2:])
    square = F.center_crop(data, [side, side])
    resized = F.resize(square, [size, size], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return indices, resized.numpy()
