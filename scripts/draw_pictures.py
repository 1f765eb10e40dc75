"""Draws the docs' pictures from real loader output, so that they show what the code does:

* ``epoch-plan.png``: which shard's samples each rank reads, batch by batch, for two epochs of
  a ``ShardLoader`` over a small index (4 ranks, 6 shards of unequal size);
* ``packed-row.png``: one ``InterleavedLoader`` batch, token by token: each row's documents,
  its image runs, the positions whose ``labels`` are masked, and the padding;
* ``budget-buckets.png``: the shapes of a ``NaFlexBudgetLoader`` epoch's batches (images x
  length) against the patch budget, beside the fixed-count batch of the same images.

Each comes from data the script writes into a scratch folder (photos from scikit-image), read
by the public API exactly as the guides read it.

    python scripts/draw_pictures.py              # writes the PNGs into docs/
    python scripts/draw_pictures.py --out DIR    # elsewhere (tests/test_docs_pictures.py)
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("epoch-plan.png", "packed-row.png", "budget-buckets.png")
SHARD_SIZES = (40, 24, 56, 32, 48, 16)  # unequal shards: the plan cuts across them
WORLD = 4
BATCH = 8


def _jpeg(image: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).convert("RGB").save(out, "JPEG", quality=85)
    return out.getvalue()


def _photos() -> list[np.ndarray]:
    from skimage import data

    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.immunohistochemistry()]


def epoch_plan(work: Path, out: Path) -> None:
    from shardstream import ShardLoader, ShardWriter, build_index, write_index

    photo = _jpeg(_photos()[0][::8, ::8])
    for shard, size in enumerate(SHARD_SIZES):  # one tar per shard, of its own size
        with ShardWriter(str(work / f"plan-{shard:02d}-%d.tar"), max_count=size) as writer:
            for i in range(size):
                writer.write({"__key__": f"s{shard}-{i:03d}", "jpg": photo, "txt": f"shard {shard}"})
    shards = sorted(str(p) for p in work.glob("plan-*.tar"))
    write_index(build_index(shards), str(work / "plan.index"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    colours = plt.get_cmap("tab10")
    for epoch, ax in enumerate(axes):
        for rank in range(WORLD):
            loader = ShardLoader(
                shards,
                index=str(work / "plan.index"),
                batch_size=BATCH,
                image_size=32,
                rank=rank,
                world_size=WORLD,
                threads=1,
                shuffle_buffer=16,
            )
            loader.set_epoch(epoch)
            column = 0
            for batch in loader:
                for key in batch.keys:
                    shard = int(key.split("-")[0][1:])
                    ax.add_patch(Rectangle((column, WORLD - 1 - rank), 1, 0.8, color=colours(shard)))
                    column += 1
            ax.set_xlim(0, column)
        ax.set_ylim(-0.2, WORLD)
        ax.set_yticks([WORLD - 1 - r + 0.4 for r in range(WORLD)], [f"rank {r}" for r in range(WORLD)])
        ax.set_xlabel(f"samples in the order rank reads them (batches of {BATCH})")
        ax.set_title(f"epoch {epoch}")
        for x in range(0, column + 1, BATCH):
            ax.axvline(x, color="white", linewidth=1.5)
    handles = [Patch(color=colours(s), label=f"shard {s} ({n})") for s, n in enumerate(SHARD_SIZES)]
    fig.legend(handles=handles, loc="lower center", ncol=len(SHARD_SIZES), frameon=False)
    fig.suptitle(f"ShardLoader over an index: {sum(SHARD_SIZES)} samples, {WORLD} ranks, equal batches")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out / "epoch-plan.png", dpi=110)
    plt.close(fig)


def packed_row(work: Path, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from shardstream import InterleavedLoader, QwenVL, count_interleaved
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    photos = _photos()
    texts, images = [], []
    rng = np.random.default_rng(0)
    for i in range(24):
        n = int(rng.integers(1, 6))
        row_t: list[str | None] = [f"Document {i} begins. " + "A sentence of the paragraph. " * n]
        row_i: list[dict | None] = [None]
        for j in range(int(rng.integers(0, 3))):
            photo = photos[(i + j) % len(photos)]
            side = int(rng.integers(4, 9))
            row_t += [None, " The photo above, described. " * int(rng.integers(1, 4))]
            row_i += [{"bytes": _jpeg(photo[::side, ::side]), "path": None}, None]
        texts.append(row_t)
        images.append(row_i)
    table = pa.table({"key": [f"doc{i}" for i in range(24)], "texts": texts, "images": images})
    pq.write_table(table, work / "docs.parquet", row_group_size=24)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
    tok.train_from_iterator(
        ["Document begins. A sentence of the paragraph. The photo above, described."] * 10,
        trainers.BpeTrainer(vocab_size=300, special_tokens=special),
    )
    tok.save(str(work / "tokenizer.json"))
    counts = count_interleaved(
        str(work / "docs.parquet"),
        tokenizer=str(work / "tokenizer.json"),
        spec=QwenVL(),
        seq_len=256,
        batch_size=4,
        threads=1,
    )
    batch = next(iter(InterleavedLoader(counts, seed=0, rank=0, world_size=1, threads=1)))
    ids = np.asarray(batch.input_ids)
    labels = np.asarray(batch.labels)
    cu = np.asarray(batch.cu_seqlens)
    rows, length = ids.shape
    # 1 and 2: the text of alternate documents (cut at cu_seqlens, over the flattened rows),
    # 3: image runs, 0: padding (each row's trailing positions whose labels are masked).
    grid = np.zeros(rows * length, dtype=int)
    for d, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        grid[a:b] = 1 + d % 2
    grid = grid.reshape(rows, length)
    grid = np.where(ids == batch.image_token_id, 3, grid)
    for r in range(rows):
        end = length
        while end > 0 and labels[r, end - 1] == -100 and grid[r, end - 1] != 3:
            end -= 1
        grid[r, end:] = 0
    fig, ax = plt.subplots(figsize=(11, 2.6))
    cmap = ListedColormap(["#dddddd", "#4c72b0", "#8fb3e0", "#dd8452"])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    masked = np.argwhere((labels == -100) & (grid != 3) & (grid != 0))
    ax.scatter(masked[:, 1], masked[:, 0], marker="|", color="black", s=60, label="labels -100")
    ax.set_yticks(range(rows), [f"row {r}" for r in range(rows)])
    ax.set_xlabel(f"token position (seq_len {length})")
    handles = [
        Patch(color="#4c72b0", label="a document's text"),
        Patch(color="#8fb3e0", label="the next document's text"),
        Patch(color="#dd8452", label="an image run (<|image_pad|>, labels -100)"),
        Patch(color="#dddddd", label="padding"),
    ]
    ax.legend(
        handles=[*handles, ax.collections[0]],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=5,
        frameon=False,
        fontsize=8,
    )
    ax.set_title(
        f"One InterleavedLoader batch: {batch.documents} documents, {len(batch.image_grid_thw)} images "
        f"({batch.pixel_values.shape[0]} patches), documents cut at cu_seqlens"
    )
    fig.tight_layout()
    fig.savefig(out / "packed-row.png", dpi=110)
    plt.close(fig)


def budget_buckets(work: Path, out: Path) -> None:
    from shardstream import NaFlex, NaFlexBudgetLoader, ShardWriter, count_patches

    rng = np.random.default_rng(1)
    photos = _photos()
    with ShardWriter(str(work / "photos-%02d.tar"), max_count=60) as writer:
        for i in range(120):
            photo = photos[i % len(photos)]
            h, w = photo.shape[:2]
            ch, cw = int(h * rng.uniform(0.2, 1.0)), int(w * rng.uniform(0.2, 1.0))
            writer.write({"__key__": f"{i:04d}", "jpg": _jpeg(photo[:ch, :cw]), "txt": f"photo {i}"})
    budget = 2048
    naflex = NaFlex(patch_size=16, max_num_patches=256)
    counts = count_patches(
        sorted(str(p) for p in work.glob("photos-*.tar")),
        naflex=naflex,
        max_patches_per_batch=budget,
        threads=1,
    )
    shapes = []
    for batch in NaFlexBudgetLoader(counts, seed=0, rank=0, world_size=1, threads=1):
        images, length, _ = batch.pixel_values.shape
        used = int(np.asarray(batch.pixel_attention_mask).sum())
        shapes.append((images, length, used))
    shapes.sort(key=lambda s: s[1])
    fig, ax = plt.subplots(figsize=(11, 3.4))
    x = 0.0
    for images, length, used in shapes:
        ax.add_patch(Rectangle((x, 0), 1, images * length, color="#dddddd"))
        ax.add_patch(Rectangle((x, 0), 1, used, color="#4c72b0"))
        ax.text(x + 0.5, images * length + 30, f"{images}x{length}", ha="center", fontsize=7, rotation=90)
        x += 1.3
    ax.axhline(budget, color="#c44e52", linestyle="--", label=f"max_patches_per_batch = {budget}")
    ax.set_xlim(-0.3, x)
    ax.set_ylim(0, budget * 1.45)
    ax.set_xticks([])
    ax.set_ylabel("patches in the batch")
    ax.set_xlabel("the epoch's batches, by length bucket (label: images x bucket length)")
    ax.legend(
        handles=[
            Patch(color="#4c72b0", label="image patches"),
            Patch(color="#dddddd", label="padding"),
            ax.lines[0],
        ],
        loc="upper left",
        ncol=3,
        frameon=False,
    )
    ax.set_title(
        f"NaFlexBudgetLoader: {sum(s[0] for s in shapes)} images in {len(shapes)} batches, padding "
        f"{counts.padding:.1%} (fixed-count batches of 256 patches: {counts.fixed_count_padding:.1%})"
    )
    fig.tight_layout()
    fig.savefig(out / "budget-buckets.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for step in (epoch_plan, packed_row, budget_buckets):
            work = Path(scratch) / step.__name__
            work.mkdir()
            step(work, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
