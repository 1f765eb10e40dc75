"""A VLM mixture with videos (issue 54's "exactness: 2 ranks with workers; resume onto 3; a
mixture of video, images and text"): a ``VlmMixture`` of LLaVA-Video conversations (a tar of
short clips FFmpeg's CLI makes from real photos, under ``QwenVL(video=QwenVideo(...))``),
OBELICS documents of real photos and captions, and a FineWeb-style text corpus, by token weight
(rows 2, 1, 1 of every batch).

* packing is invisible to the model: a tiny ``Qwen2VLForConditionalGeneration`` (its
  ``video_token_id`` the loader's) gives every run of a mixture batch (video conversations,
  documents, text) the logits of that run fed alone (1e-4), and the batch's M-RoPE positions are
  the model's own ``get_rope_index`` of the run alone (``mm_token_type_ids`` 2 on video pads);
* on 2 ranks x 2 DataLoader workers, the ranks yield the same number of batches, and each
  image-text source's part of a batch is one of that source's batches read alone on one rank
  (ids, positions, image and video pixels and grids, keys): none is read twice, and the batches
  no rank reads are exactly its loader's ``remainder_batches`` (for the video source, the
  shortest, its plan's remainder: one batch of an odd count; for the documents, the batches past
  the mixture's end). Every conversation and document with no run in those batches is read
  exactly once with its labels as read alone; one with runs there is read in part and learned
  not at all (``cut_documents``);
* stopped after 2 batches on each of 2 ranks (through the workers) and resumed onto 3 ranks
  (through the workers), the rest is read so that the same holds over the whole epoch: no
  source's batch twice, no conversation twice, the ranks short of a batch read padding.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import video_clips  # noqa: E402
from conversation_corpus import write_llava_tar  # noqa: E402
from interleaved_corpus import captions, real_documents, write_obelics_parquet  # noqa: E402
from qwen_reference import EOS, tiny_qwen2_vl_config  # noqa: E402
from shardstream import (  # noqa: E402
    Conversations,
    InterleavedLoader,
    QwenVideo,
    QwenVL,
    QwenVLCollator,
    VlmMixture,
    VlmSource,
    count_interleaved,
    count_tokens,
    vlm_rows,
)
from text_corpus import write_parquet_corpus  # noqa: E402
from video_conversations import video_conversations, write_tokenizer  # noqa: E402

# DataLoader workers are processes: each test (its fixtures included) is stopped after 240 s, and
# every DataLoader gives up on a worker silent for WORKER_TIMEOUT seconds.
pytestmark = pytest.mark.timeout(240)
WORKER_TIMEOUT = 120

SEQ_LEN, BATCH, SEED = 1024, 4, 7
WEIGHTS = (0.5, 0.25, 0.25)  # video conversations, documents, text: rows 2, 1, 1
NAMES = ("video", "docs", "text")
IMAGE_TEXT = (0, 1)  # the sources with keys, images and videos
PAD = 2  # "<pad>" of the tokenizer fixture: never in a document
WORKERS, STOP = 2, 2
LOGIT_TOLERANCE = 1e-4
#: name -> video_clips.make_clip's arguments: 1 to 2 s, at most 160x120.
CLIPS = {
    "pan.mp4": {"size": (160, 120), "seconds": 2.0, "fps": "25"},
    "cup.webm": {
        "codec": "vp9", "container": "webm", "size": (128, 96), "seconds": 1.5, "fps": "30",
        "photo": "coffee.png",
    },
    "turned.mov": {
        "container": "mov", "size": (160, 120), "seconds": 1.0, "fps": "24", "rotate": 90,
        "audio": True, "photo": "chelsea.png",
    },
}  # fmt: skip
# 36 conversations, one in four with two videos (video_conversations.VIDEO_CASES): 45 videos, 13
# batches of 2 rows (odd: the plan on 2 ranks leaves one); 40 documents, 19 batches of 1 row.
VIDEO_CONVERSATIONS, VIDEOS, DOCUMENTS = 36, 45, 40
# A frame of at most 16 merge blocks, 64 for a video's frames in all (test_interleaved_video.py's).
SPEC = QwenVL(
    min_pixels=56 * 56,
    max_pixels=28 * 28 * 64,
    video=QwenVideo(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 16, total_pixels=28 * 28 * 64),
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[VlmSource]:
    root = tmp_path_factory.mktemp("vlm-mix-video")
    clips = {}
    for name, how in CLIPS.items():
        with open(video_clips.make_clip(str(root), **how), "rb") as f:
            clips[name] = f.read()
    tokenizer = write_tokenizer(str(root / "tokenizer.json"))
    rows = vlm_rows(WEIGHTS, BATCH)
    assert rows == [2, 1, 1]
    common = {"tokenizer": tokenizer, "spec": SPEC, "seq_len": SEQ_LEN, "eos_token": EOS, "threads": 2}
    convs = video_conversations(VIDEO_CONVERSATIONS, clips, seed=5)
    tars = [write_llava_tar(str(root / f"video-{i}.tar"), convs[i::2]) for i in range(2)]
    videos = count_interleaved(tars, batch_size=rows[0], layout=Conversations(), **common)
    assert videos.skipped == {} and videos.documents == VIDEO_CONVERSATIONS, videos.skipped
    assert sum(u["videos"] for u in videos.units) == VIDEOS
    docs = real_documents(DOCUMENTS, seed=6)
    files = [write_obelics_parquet(str(root / f"docs-{i}.parquet"), docs[i::2], 4) for i in range(2)]
    documents = count_interleaved(files, batch_size=rows[1], **common)
    assert documents.skipped == {} and documents.documents == DOCUMENTS, documents.skipped
    texts = [" ".join(captions()[i : i + 12]) for i in range(0, 900, 6)]
    text = count_tokens(write_parquet_corpus(str(root / "text"), texts, files=2), tokenizer=tokenizer)
    return [VlmSource(c, w, n) for c, w, n in zip((videos, documents, text), WEIGHTS, NAMES, strict=True)]


def mixture(sources, rank: int = 0, world_size: int = 2) -> VlmMixture:
    return VlmMixture(
        sources, batch_size=BATCH, seed=SEED, pad_token_id=PAD, rank=rank, world_size=world_size, threads=2
    )


# -- a batch's parts ----------------------------------------------------------------------------


@dataclass
class Part:
    """One source's rows of a batch (or a source's batch read alone): what it holds."""

    source: int
    digest: str  # ids, positions, cu_seqlens, keys, images' and videos' grids and pixels
    labels: torch.Tensor  # flat over the part's rows
    runs: list[tuple[int, int, str | None]] = field(default_factory=list)  # (start, end, key)
    images: int = 0
    videos: int = 0

    @property
    def padding(self) -> bool:
        return not self.runs

    def learned(self) -> list[tuple[str | None, int]]:
        return [(key, int((self.labels[a:e] != -100).sum())) for a, e, key in self.runs]


def parts_of(batch, rows: list[int], text: set[int], vision: tuple[int, int]) -> list[Part]:
    """The batch's parts, source by source (rows ``rows[0]`` for the first, ...): a source's
    images and videos are the next ones of the batch's (the mixture joins them in source order,
    each source's in the order its runs appear); its runs' keys the next ones of ``batch.keys``,
    sources in ``text`` having none. ``vision``: the ids of ``<|vision_start|>`` and
    ``<|video_pad|>``."""
    start, video_pad = vision
    seq_len = batch.input_ids.shape[1]
    cu = batch.cu_seqlens.tolist()
    positions = batch.packed_position_ids
    image_grids = batch.image_grid_thw
    video_grids = (
        batch.video_grid_thw if batch.video_grid_thw is not None else torch.zeros((0, 3), dtype=torch.int64)
    )
    keys = iter(batch.keys)
    image = image_row = video = video_row = 0
    out, first = [], 0
    for source, n in enumerate(rows):
        at, end = first * seq_len, (first + n) * seq_len
        assert at in cu and end in cu, "a source's rows hold its own sequences"
        ids = batch.input_ids[first : first + n]
        flat = ids.reshape(-1)
        local = [c - at for c in cu if at <= c <= end]
        runs = [(a, e) for a, e in zip(local, local[1:], strict=False) if bool((flat[a:e] != PAD).any())]
        opened = (flat[:-1] == start).nonzero().flatten() + 1
        n_videos = int((flat[opened] == video_pad).sum())
        n_images = len(opened) - n_videos
        g_images, g_videos = image_grids[image : image + n_images], video_grids[video : video + n_videos]
        n_image_rows, n_video_rows = int(g_images.prod(-1).sum()), int(g_videos.prod(-1).sum())
        pixels = batch.pixel_values[image_row : image_row + n_image_rows]
        video_pixels = (
            batch.pixel_values_videos[video_row : video_row + n_video_rows]
            if n_videos
            else torch.zeros((0,), dtype=torch.uint8)
        )
        image, image_row = image + n_images, image_row + n_image_rows
        video, video_row = video + n_videos, video_row + n_video_rows
        run_keys = [None if source in text else next(keys) for _ in runs]
        h = hashlib.sha256()
        for t in (
            ids,
            positions[:, first : first + n],
            torch.tensor(local),
            g_images,
            pixels,
            g_videos,
            video_pixels,
        ):
            h.update(t.contiguous().numpy().tobytes())
        h.update(repr(run_keys).encode())
        labels = batch.labels[first : first + n].reshape(-1).clone()
        runs_keyed = [(a, e, k) for (a, e), k in zip(runs, run_keys, strict=True)]
        out.append(Part(source, h.hexdigest(), labels, runs_keyed, n_images, n_videos))
        first += n
    assert next(keys, None) is None, "one key per image-text run"
    assert image == len(image_grids) and image_row == len(batch.pixel_values)
    assert video == len(video_grids)
    if batch.pixel_values_videos is not None:
        assert video_row == len(batch.pixel_values_videos)
    return out


def vision_of(loader) -> tuple[int, int]:
    return loader.vision_token_ids[0], loader.video_token_id


def mixture_parts(mix, batch) -> list[Part]:
    return parts_of(batch, mix.rows, {NAMES.index("text")}, vision_of(mix.loaders[0]))


@pytest.fixture(scope="module")
def whole(sources) -> dict[int, list[Part]]:
    """Each image-text source read alone on one rank with the mixture's seed for it: its
    batches, each one part."""
    out = {}
    for i in IMAGE_TEXT:
        loader = InterleavedLoader(
            sources[i].counts, seed=SEED * 1_000_003 + i, pad_token_id=PAD, rank=0, world_size=1, threads=2
        )
        out[i] = [parts_of(b, [loader.batch_size], set(), vision_of(loader))[0] for b in loader]
        assert len(out[i]) == sources[i].counts.total_batches
        assert loader.stats["cut_documents"] == 0 and loader.stats["remainder_batches"] == 0
    assert sum(p.videos for p in out[0]) == VIDEOS
    return out


def check_read_once(read: list[Part], whole: list[Part]) -> tuple[set[str], set[str]]:
    """``read`` (a source's parts over an epoch's ranks, padding apart) are batches of ``whole``
    (the source read alone), none twice; each run has its labels there or none. Every key with no
    run in a batch left unread is read exactly once, learned as alone; one with runs there is read
    in the other batches only and learned not at all. Returns the unread batches' digests and
    the keys cut."""
    by_digest = {p.digest: p for p in whole}
    assert len(by_digest) == len(whole)
    digests = [p.digest for p in read]
    assert len(digests) == len(set(digests)), "a batch of the source read twice"
    assert set(digests) <= set(by_digest), "a batch made up"
    unread = set(by_digest) - set(digests)
    for p in read:
        alone = by_digest[p.digest]
        for a, e, key in p.runs:
            if not torch.equal(p.labels[a:e], alone.labels[a:e]):
                assert bool((p.labels[a:e] == -100).all()), f"{key}: a run learned in part"
    seen, runs_whole, runs_unread = defaultdict(list), defaultdict(list), Counter()
    for p in read:
        for key, learned in p.learned():
            seen[key].append(learned)
    for p in whole:
        for key, learned in p.learned():
            runs_whole[key].append(learned)
            runs_unread[key] += p.digest in unread
    assert set(seen) <= set(runs_whole)
    cut = set()
    for key, learned in runs_whole.items():
        got = seen.get(key, [])
        if not runs_unread[key]:
            assert Counter(got) == Counter(learned), f"{key}: read {got}, alone {learned}"
        else:
            assert len(got) == len(learned) - runs_unread[key], f"{key}: a run read twice or lost"
            if got:
                assert sum(got) == 0, f"{key} is read in part but learned: {got}"
                cut.add(key)
    return unread, cut


def iterate(mix, read: dict, stop: int | None = None):
    """Reads ``mix`` through 2 DataLoader workers (``stop`` batches, or all), adding each
    image-text source's parts but padding to ``read[i]``, each text part's digest to
    ``read["text"]``, and counting each source's parts of padding in ``read["padding"]``;
    returns the DataLoader and the batches read."""
    loader = mix.dataloader(WORKERS, timeout=WORKER_TIMEOUT)
    it, n = iter(loader), 0
    try:
        for batch in it:
            assert batch.video_token_id == mix.loaders[0].video_token_id
            for p in mixture_parts(mix, batch):
                if p.padding:
                    read["padding"][NAMES[p.source]] += 1
                elif p.source in IMAGE_TEXT:
                    read[p.source].append(p)
                else:
                    read["text"].append(p.digest)
            n += 1
            if n == stop:
                break
    finally:
        it.close()  # the DataLoader's workers end with its iterator
    return loader, n


def nothing_read() -> dict:
    return {**{i: [] for i in IMAGE_TEXT}, "text": [], "padding": Counter()}


# -- isolation ------------------------------------------------------------------------------------


def test_every_run_of_a_mixture_batch_has_its_logits_and_positions_alone(sources):
    """Each run of the first batches (video conversations, some with a photo; documents; text
    rows) has in the packed batch the logits of that run fed alone (its ids, its images and
    videos), and the batch's positions are ``get_rope_index``'s of the run alone."""
    import tokenizers

    mix = mixture(sources, world_size=1)
    first = mix.loaders[0]
    vocab = tokenizers.Tokenizer.from_file(sources[0].counts.tokenizer).get_vocab_size()
    config = tiny_qwen2_vl_config(vocab, first.vision_token_ids, layers=2, pad_id=PAD)
    config.video_token_id = first.video_token_id
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    model = model.eval()
    collate = QwenVLCollator()
    seq_len = mix.seq_len
    compared = Counter()
    for n, batch in enumerate(mix):
        if n == 3:
            break
        inputs = collate(batch)
        inputs.pop("labels")
        with torch.no_grad():
            packed = model(**inputs).logits
        kinds_of = batch.mm_token_type_ids
        parts = mixture_parts(mix, batch)
        image = image_row = video = video_row = 0
        first_row = 0
        for part, rows in zip(parts, mix.rows, strict=True):
            runs_per_row = Counter(a // seq_len for a, _, _ in part.runs)
            compared["rows_with_several"] += sum(c > 1 for c in runs_per_row.values())
            for a, e, key in part.runs:
                row, at = first_row + a // seq_len, a % seq_len
                end = at + (e - a)
                assert end <= seq_len, "a run stays in its row"
                ids, kinds = batch.input_ids[row, at:end], kinds_of[row, at:end]
                opened = (ids[:-1] == first.vision_token_ids[0]).nonzero().flatten() + 1
                n_videos = int((kinds[opened] == 2).sum())
                n_images = len(opened) - n_videos
                alone = {"input_ids": ids[None], "mm_token_type_ids": kinds[None]}
                if n_images:
                    g = inputs["image_grid_thw"][image : image + n_images]
                    rows_of = int(g.prod(-1).sum())
                    alone["pixel_values"] = inputs["pixel_values"][image_row : image_row + rows_of]
                    alone["image_grid_thw"] = g
                    image, image_row = image + n_images, image_row + rows_of
                if n_videos:
                    g = inputs["video_grid_thw"][video : video + n_videos]
                    rows_of = int(g.prod(-1).sum())
                    alone["pixel_values_videos"] = inputs["pixel_values_videos"][
                        video_row : video_row + rows_of
                    ]
                    alone["video_grid_thw"] = g
                    video, video_row = video + n_videos, video_row + rows_of
                with torch.no_grad():
                    want = model(**alone).logits[0]
                    rope, _ = model.model.get_rope_index(
                        ids[None], kinds[None], alone.get("image_grid_thw"), alone.get("video_grid_thw")
                    )
                diff = float((packed[row, at:end] - want).abs().max())
                assert diff < LOGIT_TOLERANCE, (NAMES[part.source], key, row, at, end, diff)
                given = inputs["position_ids"][:, row, at:end]
                assert given[0].tolist() == list(range(end - at)), (key, "positions restart at the run")
                assert torch.equal(given[1:], rope[:, 0]), (key, "M-RoPE positions as the run alone")
                compared["runs"] += 1
                compared[f"{NAMES[part.source]}_runs"] += 1
                compared["videos"] += n_videos
                compared["images"] += n_images
                compared["photo_and_video_runs"] += bool(n_videos and n_images)
            first_row += rows
        assert image == len(batch.image_grid_thw) and video == len(batch.video_grid_thw)
    print("compared:", dict(compared))
    assert compared["videos"] > 3 and compared["images"] > 3 and compared["text_runs"] > 3, compared
    assert compared["docs_runs"] > 0 and compared["photo_and_video_runs"] > 0, compared
    assert compared["rows_with_several"] > 0, compared


# -- exactness ------------------------------------------------------------------------------------


def test_an_epoch_on_two_ranks_with_two_workers_reads_every_conversation_once(sources, whole):
    """Both ranks yield the mixture's length; over them, every source's batch is read at most
    once, those unread are its ``remainder_batches`` (the video source's is its plan's
    remainder, one batch of 13), and every conversation and document is read once or, with a
    run in an unread batch, cut (read in part, unlearned) as ``cut_documents`` counts."""
    read = nothing_read()
    epoch = len(mixture(sources))
    cut_counted, remainders = Counter(), []
    for rank in range(2):
        loader, n = iterate(mixture(sources, rank=rank), read)
        assert n == len(loader) == epoch
        stats = loader.stats["sources"]
        remainders.append({NAMES[i]: stats[NAMES[i]]["remainder_batches"] for i in IMAGE_TEXT})
        for i in IMAGE_TEXT:
            cut_counted[NAMES[i]] += stats[NAMES[i]]["cut_documents"]
    assert read["padding"] == Counter(), "an uninterrupted epoch reads no padding"
    # The video source is the shortest, of an odd count (13 batches): its remainder is one batch.
    totals = [sources[i].counts.total_batches for i in IMAGE_TEXT]
    assert epoch == totals[0] // 2 < totals[1] // 2 and totals[0] % 2 == 1, (totals, epoch)
    assert remainders[0] == remainders[1] == {"video": 1, "docs": totals[1] - 2 * epoch}, remainders
    for i in IMAGE_TEXT:
        unread, cut = check_read_once(read[i], whole[i])
        assert len(unread) == remainders[0][NAMES[i]]
        assert len(cut) == cut_counted[NAMES[i]], (NAMES[i], cut, cut_counted)
        # Every video and image but those of the unread batches was read.
        for what in ("videos", "images"):
            left_out = sum(getattr(p, what) for p in whole[i] if p.digest in unread)
            got = sum(getattr(p, what) for p in read[i])
            assert got == sum(getattr(p, what) for p in whole[i]) - left_out, (NAMES[i], what)
    assert sum(p.videos for p in read[0]) > 0 and sum(p.images for p in read[0]) > 0
    assert sum(p.images for p in read[1]) > 0
    assert cut_counted["docs"] > 0, "the mixture's end cuts no document: the cut rule is untested"
    assert len(read["text"]) == 2 * epoch == len(set(read["text"])), "every text part read once"


@pytest.fixture(scope="module")
def resumed(sources) -> dict:
    """Stopped after 2 batches on each of 2 ranks and resumed onto 3 ranks, all through 2
    DataLoader workers: what was read before and after, the states, the new ranks' lengths and
    their stats' ``padding_batches``."""
    read = nothing_read()
    states = []
    for rank in range(2):
        loader, n = iterate(mixture(sources, rank=rank), read, stop=STOP)
        assert n == STOP
        states.append(loader.state_dict(STOP))
    assert read["padding"] == Counter()
    lengths, counted = [], Counter()
    for rank in range(3):
        mix = mixture(sources, rank=rank, world_size=3)
        mix.load_state_dict(states[0])
        loader, n = iterate(mix, read)
        lengths.append(n)
        for name, per in loader.stats["sources"].items():
            counted[name] += per["padding_batches"]
    return {"read": read, "states": states, "lengths": lengths, "counted": counted}


def test_a_stop_on_two_ranks_resumed_onto_three_reads_the_rest_once(sources, whole, resumed):
    """The state is the same on both ranks; the new ranks yield the same number of batches, the
    short ones a part of padding per image-text source (the text source leaves its remainder
    as packed text does); over the batches before and after, the epoch reads as the
    uninterrupted one: no source's batch twice, the same remainder, every conversation and
    document once or cut."""
    read, lengths = resumed["read"], resumed["lengths"]
    assert resumed["states"][0] == resumed["states"][1], "the state is the same on every rank"
    epoch = len(mixture(sources))
    left = 2 * (epoch - STOP)  # each source's batches left
    assert lengths == [-(-left // 3)] * 3, (lengths, left)
    padding = read["padding"]
    assert padding["video"] == padding["docs"] == 3 * lengths[0] - left > 0, padding
    assert padding["text"] == 3 * (lengths[0] - left // 3) > 0, padding
    # The image-text sources' loaders count their parts of padding.
    assert resumed["counted"]["video"] == padding["video"] and resumed["counted"]["docs"] == padding["docs"]
    for i in IMAGE_TEXT:
        unread, _ = check_read_once(read[i], whole[i])
        assert len(unread) == sources[i].counts.total_batches - 2 * epoch, NAMES[i]
    assert sum(p.videos for p in read[0]) > 0
    texts = read["text"]
    assert len(texts) == len(set(texts)) == 2 * epoch - left % 3, "the text parts read once"


def test_a_text_sources_padding_is_counted_through_workers(resumed):
    """``stats["sources"]["text"]["padding_batches"]`` counts the text source's parts of
    padding when the mixture is read through DataLoader workers, as it does in-process."""
    assert resumed["counted"]["text"] == resumed["read"]["padding"]["text"] > 0, resumed["counted"]
