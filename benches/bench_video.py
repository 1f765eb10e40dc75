"""Video clips decoded at their sampled frames, per core (issue 54): the Qwen path's frames
(qwen-vl-utils' 2 fps sampling, ``smart_resize``'s size) from clips FFmpeg's CLI makes from real
photos (tests/video_clips.py: a pan across a scikit-image photo, H.264 High with B-frames).

  floor: FFmpeg decode only          PyAV (one thread) decoding every frame up to the last
                                     sampled one, converting none: what a decoder that skips no
                                     frame must do (PyAV's bundled FFmpeg)
  TorchCodec + torchvision resize    VideoDecoder(bytes).get_frames_at(indices), then the
                                     antialiased bicubic resize qwen-vl-utils runs
  TorchCodec + Qwen2VLVideoProcessor the same frames through transformers' fast video processor
                                     (do_rescale/do_normalize off): patches, more work than ours
  shardstream decode_frames          shardstream.video.decode_frames(bytes, indices, size)

Every contender runs in its own process pinned to one core, with torch at one thread, and keeps
its best of ``--repeat`` rounds over the same ``--clips`` clips. This times decoding and
resizing only; benches/bench_video_clips.py times the CLIP clip loader reading a shard.

    python benches/bench_video.py [--clips 8] [--seconds 10] [--size 640x360] [--gop 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from fractions import Fraction

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

CONTENDERS = ["floor", "torchcodec", "torchcodec_processor", "shardstream"]
LABELS = {
    "floor": "floor: FFmpeg decode only (PyAV)",
    "torchcodec": "TorchCodec + torchvision resize",
    "torchcodec_processor": "TorchCodec + Qwen2VLVideoProcessor",
    "shardstream": "shardstream decode_frames",
}


def plan(path: str) -> dict:
    """The frames and size the Qwen path reads of a clip (the same for every contender)."""
    from shardstream import video

    with open(path, "rb") as f:
        info = video.probe(f.read())
    sampled = video.sample_frames(info.frames, info.fps)
    size = video.frame_size(info.height, info.width, len(sampled.indices))
    return {"indices": sampled.indices, "size": [size.height, size.width]}


def worker(name: str, paths: list[str], todo: dict, repeat: int) -> dict:
    import torch

    torch.set_num_threads(1)
    datas = [open(p, "rb").read() for p in paths]
    indices, (height, width) = todo["indices"], todo["size"]
    last = max(indices)

    if name == "floor":
        import av

        def one(data: bytes) -> int:
            import io

            with av.open(io.BytesIO(data)) as c:
                stream = c.streams.video[0]
                stream.thread_count = 1
                for n, _ in enumerate(c.decode(stream)):
                    if n == last:
                        return n + 1
            return 0
    elif name in ("torchcodec", "torchcodec_processor"):
        from torchcodec.decoders import VideoDecoder
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        if name == "torchcodec_processor":
            from transformers import Qwen2VLVideoProcessor

            processor = Qwen2VLVideoProcessor(do_rescale=False, do_normalize=False, do_sample_frames=False)

        def one(data: bytes) -> int:
            frames = VideoDecoder(data, num_ffmpeg_threads=1).get_frames_at(indices).data
            if name == "torchcodec":
                bicubic = InterpolationMode.BICUBIC
                out = F.resize(frames, [height, width], interpolation=bicubic, antialias=True)
                return int(out.shape[0])
            out = processor(videos=[frames], return_tensors="pt")
            return int(out["video_grid_thw"][0][0])
    else:
        from shardstream import video

        def one(data: bytes) -> int:
            return video.decode_frames(data, indices, size=(height, width)).frames_decoded

    decoded = one(datas[0])  # warm: imports, libraries loaded
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for data in datas:
            one(data)
        rounds.append(len(datas) / (time.perf_counter() - start))
    return {"clips_per_s": max(rounds), "rounds": [round(r, 2) for r in rounds], "decoded": decoded}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", default="640x360")
    p.add_argument("--fps", default="25")
    p.add_argument("--gop", type=int, default=250)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--worker")
    p.add_argument("--paths")
    p.add_argument("--todo")
    p.add_argument("--cpus", default="[0]")
    a = p.parse_args()
    if a.worker:
        pin(a.cpus)
        print_result(worker(a.worker, json.loads(a.paths), json.loads(a.todo), a.repeat))
        return

    import video_clips

    width, height = (int(x) for x in a.size.split("x"))
    folder = tempfile.mkdtemp(prefix="bench-video-")
    photos = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg"]
    paths = [
        video_clips.make_clip(
            folder, seconds=a.seconds, size=(width, height), fps=a.fps, gop=a.gop, photo=photo
        )
        for photo in photos[: a.clips]
    ]
    paths = [paths[i % len(paths)] for i in range(a.clips)]
    todo = plan(paths[0])
    total = round(a.seconds * Fraction(a.fps))
    print(
        f"{a.clips} clips of {a.seconds:g} s, {a.size} at {a.fps} fps, H.264 High, GOP {a.gop}: "
        f"{len(todo['indices'])} frames sampled of {total}, resized to {todo['size'][1]}x{todo['size'][0]}"
    )
    options = {"paths": paths, "todo": todo, "repeat": a.repeat}
    results = {n: try_worker(__file__, n, options) for n in CONTENDERS}
    ours = (results.get("shardstream") or {}).get("clips_per_s")
    sampled = len(todo["indices"])
    floor = max(todo["indices"]) + 1
    if results.get("shardstream"):
        decoded = results["shardstream"]["decoded"]
        print(
            f"frames decoded per frame sampled: shardstream {decoded / sampled:.1f} ({decoded} of the "
            f"{floor} up to the last sampled; the floor and TorchCodec {floor / sampled:.1f})"
        )
    print(f"{'contender':38} {'clips/s':>9} {'rounds':>24} {'shardstream is':>15}")
    for n in CONTENDERS:
        r = results[n]
        if r is None:
            continue
        ratio = f"{ours / r['clips_per_s']:.2f}x" if ours else "-"
        print(f"{LABELS[n]:38} {r['clips_per_s']:9.2f} {str(r['rounds']):>24} {ratio:>15}")


if __name__ == "__main__":
    main()
