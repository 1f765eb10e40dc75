"""Video conversations into Qwen2-VL inputs, per core (issue 54): LLaVA-Video-style samples (a
question about one clip, an answer), each clip read at qwen-vl-utils' frames and sizes (2 frames
a second, its default pixel budgets), from clips FFmpeg's CLI makes from real photos
(tests/video_clips.py: pans across scikit-image photos, H.264 High with B-frames).

  qwen-vl-utils + Qwen2VLProcessor   what a Qwen2-VL fine-tuning script runs today: the JSON
                                     and one MP4 file a sample on disk, fetch_video (TorchCodec
                                     backend, TORCHCODEC_NUM_THREADS=1) reads the frames at
                                     its sizes (torchvision's antialiased bicubic), the processor
                                     (ids, pixel_values_videos rescaled and normalised,
                                     video_grid_thw) makes a batch
  shardstream InterleavedLoader      the same samples in a tar; count_interleaved once (timed
                                     apart), then the loader with one decode thread: ids,
                                     labels, positions, pixel_values_videos as uint8 (normalised
                                     on the device by QwenVLCollator, not timed here)

Every contender runs in its own process pinned to one core, with torch at one thread, and keeps
its best of ``--repeat`` passes. The unit is conversations (one video each) a second.

    python benches/bench_video_rows.py [--clips 8] [--seconds 10] [--size 640x360] [--gop 250]
        [--batch 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

CONTENDERS = ["processor", "shardstream"]
LABELS = {
    "processor": "qwen-vl-utils + Qwen2VLProcessor",
    "shardstream": "shardstream InterleavedLoader",
}
QUESTION = "<video>\nWhat does the camera do?"
ANSWER = "It pans across a photo."


def worker(name: str, folder: str, todo: dict, repeat: int) -> dict:
    import torch

    torch.set_num_threads(1)
    batch, tokenizer = todo["batch"], todo["tokenizer"]
    counted = None
    if name == "processor":
        os.environ["FORCE_QWENVL_VIDEO_READER"] = "torchcodec"
        os.environ["TORCHCODEC_NUM_THREADS"] = "1"  # its default is 8: on one core, one
        import transformers
        from qwen_reference import IM_END, IM_START
        from qwen_vl_utils import vision_process as vp

        processor = transformers.Qwen2VLProcessor(
            image_processor=transformers.Qwen2VLImageProcessor(),
            tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer, pad_token="<pad>"),
            video_processor=transformers.Qwen2VLVideoProcessor(),
        )
        with open(os.path.join(folder, "conversations.json"), encoding="utf-8") as f:
            samples = json.load(f)

        def text(turns: list[dict]) -> str:
            roles = {"human": "user", "gpt": "assistant"}
            video = "<|vision_start|><|video_pad|><|vision_end|>"
            return "".join(
                f"{IM_START}{roles[t['from']]}\n{t['value'].replace('<video>', video)}{IM_END}\n"
                for t in turns
            )

        def one_pass() -> int:
            done, texts, videos = 0, [], []
            for s in samples:
                frames = vp.fetch_video({"video": os.path.join(folder, s["video"])})
                texts.append(text(s["conversations"]))
                videos.append(frames)
                if len(texts) == batch:
                    out = processor(
                        text=texts,
                        videos=videos,
                        padding=True,
                        videos_kwargs={"do_resize": False, "do_sample_frames": False},
                        return_tensors="pt",
                    )
                    done += int(out["video_grid_thw"].shape[0])
                    texts, videos = [], []
            return done
    else:
        from shardstream import Conversations, InterleavedLoader, QwenVideo, QwenVL, count_interleaved

        spec = QwenVL(video=QwenVideo())
        start = time.perf_counter()
        counts = count_interleaved(
            os.path.join(folder, "conversations.tar"),
            tokenizer=tokenizer,
            spec=spec,
            layout=Conversations(),
            seq_len=todo["seq_len"],
            batch_size=batch,
            eos_token="</s>",
            threads=1,
        )
        counted = time.perf_counter() - start

        def one_pass() -> int:
            loader = InterleavedLoader(counts, threads=1, pin_memory=False)
            return sum(0 if b.video_grid_thw is None else int(b.video_grid_thw.shape[0]) for b in loader)

    videos = one_pass()  # warm: imports, libraries loaded
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        one_pass()
        rounds.append(videos / (time.perf_counter() - start))
    result = {"per_s": max(rounds), "rounds": [round(r, 2) for r in rounds], "videos": videos}
    if counted is not None:
        result["count_s"] = round(counted, 3)
    return result


def write_corpus(paths: list[str], folder: str) -> None:
    """The same conversations twice: a JSON list with one MP4 file a sample (the layout Qwen's
    scripts read), and a tar of ``KEY.json`` + ``KEY.mp4`` (LLaVA-Video's in a shard)."""
    samples = []
    with tarfile.open(os.path.join(folder, "conversations.tar"), "w") as tar:
        for i, path in enumerate(paths):
            name = f"{i:06d}.mp4"
            shutil.copyfile(path, os.path.join(folder, name))
            turns = [{"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}]
            samples.append({"video": name, "conversations": turns})
            with open(path, "rb") as f:
                data = f.read()
            meta = json.dumps({"video": "mp4", "conversations": turns}).encode()
            for member, payload in ((f"{i:06d}.json", meta), (name, data)):
                info = tarfile.TarInfo(member)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    with open(os.path.join(folder, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(samples, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", default="640x360")
    p.add_argument("--fps", default="25")
    p.add_argument("--gop", type=int, default=250)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--worker")
    p.add_argument("--folder")
    p.add_argument("--todo")
    p.add_argument("--cpus", default="[0]")
    a = p.parse_args()
    if a.worker:
        pin(a.cpus)
        print_result(worker(a.worker, a.folder, json.loads(a.todo), a.repeat))
        return

    import video_clips
    from video_conversations import write_tokenizer

    width, height = (int(x) for x in a.size.split("x"))
    folder = tempfile.mkdtemp(prefix="bench-video-rows-")
    photos = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg"]
    made = [
        video_clips.make_clip(
            folder, seconds=a.seconds, size=(width, height), fps=a.fps, gop=a.gop, photo=photo
        )
        for photo in photos[: a.clips]
    ]
    write_corpus([made[i % len(made)] for i in range(a.clips)], folder)
    todo = {
        "batch": a.batch,
        "seq_len": a.seq_len,
        "tokenizer": write_tokenizer(os.path.join(folder, "tokenizer.json")),
    }
    print(
        f"{a.clips} conversations, one clip each of {a.seconds:g} s, {a.size} at {a.fps} fps, H.264 High, "
        f"GOP {a.gop}: qwen-vl-utils' frames (2 fps) and sizes, batches of {a.batch}"
    )
    options = {"folder": folder, "todo": todo, "repeat": a.repeat}
    results = {n: try_worker(__file__, n, options) for n in CONTENDERS}
    ours = (results.get("shardstream") or {}).get("per_s")
    print(f"{'contender':36} {'videos/s':>9} {'rounds':>24} {'shardstream is':>15}")
    for n in CONTENDERS:
        r = results[n]
        if r is None:
            continue
        ratio = f"{ours / r['per_s']:.2f}x" if ours else "-"
        print(f"{LABELS[n]:36} {r['per_s']:9.2f} {str(r['rounds']):>24} {ratio:>15}")
    if results.get("shardstream"):
        print(f"count_interleaved (once, before training): {results['shardstream']['count_s']} s")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
