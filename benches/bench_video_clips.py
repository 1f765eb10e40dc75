"""Video-text CLIP clips from a tar shard, per core (issue 54): ``uint8 [B, T, 3, S, S]`` batches
of ``T`` frames spread over each clip, the centred square resized to ``S``, from clips FFmpeg's
CLI makes from real photos (tests/video_clips.py: pans across scikit-image photos, H.264 High
with B-frames), each with a caption.

  webdataset + TorchCodec + torchvision  what a user writes today: webdataset reads the tar,
                                         TorchCodec's VideoDecoder (exact mode, one FFmpeg
                                         thread) gets the frames at the same numbers,
                                         torchvision centre-crops and resizes (antialiased
                                         bicubic), torch.stack makes the batch
  shardstream VideoLoader                count_clips once (timed apart), then VideoLoader with
                                         one decode thread

Every contender runs in its own process pinned to one core, with torch at one thread, and keeps
its best of ``--repeat`` passes over the shard.

    python benches/bench_video_clips.py [--clips 16] [--seconds 10] [--size 640x360] [--frames 8]
        [--crop 224] [--batch 8] [--gop 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

CONTENDERS = ["torchcodec", "shardstream"]
LABELS = {
    "torchcodec": "webdataset + TorchCodec + torchvision",
    "shardstream": "shardstream VideoLoader",
}


def worker(name: str, shard: str, todo: dict, repeat: int) -> dict:
    import torch

    torch.set_num_threads(1)
    frames, crop, batch = todo["frames"], todo["crop"], todo["batch"]
    counted = None
    if name == "torchcodec":
        import webdataset as wds
        from torchcodec.decoders import VideoDecoder
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as F

        def clip(data: bytes) -> torch.Tensor:
            decoder = VideoDecoder(data, seek_mode="exact", num_ffmpeg_threads=1)
            n = decoder.metadata.num_frames
            indices = torch.linspace(0, n - 1, frames).round().to(torch.int64).tolist()
            x = decoder.get_frames_at(indices).data
            side = min(x.shape[-2:])
            x = F.center_crop(x, [side, side])
            return F.resize(x, [crop, crop], interpolation=InterpolationMode.BICUBIC, antialias=True)

        def one_pass() -> int:
            done, pending = 0, []
            for sample in wds.WebDataset(shard, shardshuffle=False, empty_check=False):
                pending.append(clip(sample["mp4"]))
                if len(pending) == batch:
                    done += int(torch.stack(pending).shape[0])
                    pending = []
            return done  # a last short batch is dropped, as VideoLoader's remainder
    else:
        from shardstream import VideoLoader, count_clips

        start = time.perf_counter()
        counts = count_clips(shard, threads=1)
        counted = time.perf_counter() - start

        def one_pass() -> int:
            loader = VideoLoader(
                counts, batch_size=batch, frames=frames, size=crop, threads=1, pin_memory=False
            )
            return sum(int(b.frames.shape[0]) for b in loader)

    clips = one_pass()  # warm: imports, libraries loaded
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        one_pass()
        rounds.append(clips / (time.perf_counter() - start))
    result = {"clips_per_s": max(rounds), "rounds": [round(r, 2) for r in rounds], "clips": clips}
    if counted is not None:
        result["count_s"] = round(counted, 3)
    return result


def write_shard(paths: list[str], folder: str) -> str:
    shard = os.path.join(folder, "clips-000.tar")
    with tarfile.open(shard, "w") as tar:
        for i, path in enumerate(paths):
            with open(path, "rb") as f:
                data = f.read()
            for name, payload in ((f"{i:06d}.mp4", data), (f"{i:06d}.txt", f"a pan, clip {i}".encode())):
                member = tarfile.TarInfo(name)
                member.size = len(payload)
                tar.addfile(member, io.BytesIO(payload))
    return shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", default="640x360")
    p.add_argument("--fps", default="25")
    p.add_argument("--gop", type=int, default=250)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--worker")
    p.add_argument("--shard")
    p.add_argument("--todo")
    p.add_argument("--cpus", default="[0]")
    a = p.parse_args()
    if a.worker:
        pin(a.cpus)
        print_result(worker(a.worker, a.shard, json.loads(a.todo), a.repeat))
        return

    import video_clips

    width, height = (int(x) for x in a.size.split("x"))
    folder = tempfile.mkdtemp(prefix="bench-video-clips-")
    photos = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg"]
    made = [
        video_clips.make_clip(
            folder, seconds=a.seconds, size=(width, height), fps=a.fps, gop=a.gop, photo=photo
        )
        for photo in photos[: a.clips]
    ]
    shard = write_shard([made[i % len(made)] for i in range(a.clips)], folder)
    todo = {"frames": a.frames, "crop": a.crop, "batch": a.batch}
    print(
        f"{a.clips} clips of {a.seconds:g} s, {a.size} at {a.fps} fps, H.264 High, GOP {a.gop}, in one tar: "
        f"{a.frames} frames a clip, {a.crop}x{a.crop}, batches of {a.batch}"
    )
    options = {"shard": shard, "todo": todo, "repeat": a.repeat}
    results = {n: try_worker(__file__, n, options) for n in CONTENDERS}
    ours = (results.get("shardstream") or {}).get("clips_per_s")
    print(f"{'contender':40} {'clips/s':>9} {'rounds':>24} {'shardstream is':>15}")
    for n in CONTENDERS:
        r = results[n]
        if r is None:
            continue
        ratio = f"{ours / r['clips_per_s']:.2f}x" if ours else "-"
        print(f"{LABELS[n]:40} {r['clips_per_s']:9.2f} {str(r['rounds']):>24} {ratio:>15}")
    if results.get("shardstream"):
        print(f"count_clips (once, before training): {results['shardstream']['count_s']} s for the shard")


if __name__ == "__main__":
    main()
