"""Which shards the trainer reads, and the ShardLoaders it reads them with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardstream.train.config import Config, ConfigError
from shardstream.train.dist import DistContext, barrier


@dataclass(frozen=True)
class DataSources:
    train: str | list[str]
    train_index: str | None
    heldout: str | list[str] | None
    heldout_index: str | None
    zeroshot: str | None  # root of the labelled set (CLIP_benchmark's layout), or None
    zeroshot_index: str | None


def resolve_sources(cfg: Config, ctx: DistContext, log: Callable[[str], None]) -> DataSources:
    """The configured shards; 'demo' ones are generated first if absent, by the first process of
    each node (identical files: whichever finishes first wins), while the others wait."""
    uses_demo = "demo" in (cfg.data.train, cfg.data.heldout) or cfg.eval.zeroshot == "demo"
    demo = None
    if uses_demo:
        from shardstream.train.data import ensure_demo_data

        if ctx.local_rank == 0:
            ensure_demo_data(cfg.data.demo_dir, log=log if ctx.is_main else (lambda _: None))
        barrier(ctx)
        demo = ensure_demo_data(cfg.data.demo_dir, log=log)

    def pick(
        value: str, index: str, demo_shards: list[str] | None, demo_index: str | None
    ) -> tuple[str | list[str] | None, str | None]:
        if value == "demo":
            assert demo_shards is not None
            return demo_shards, demo_index
        return (value or None), (index or None)

    train, train_index = pick(
        cfg.data.train,
        cfg.data.train_index,
        demo.train_shards if demo else None,
        demo.train_index if demo else None,
    )
    heldout, heldout_index = pick(
        cfg.data.heldout,
        cfg.data.heldout_index,
        demo.heldout_shards if demo else None,
        demo.heldout_index if demo else None,
    )
    if cfg.eval.zeroshot == "demo":
        assert demo is not None
        zeroshot, zeroshot_index = demo.zeroshot, demo.zeroshot_index
    else:
        zeroshot, zeroshot_index = cfg.eval.zeroshot or None, cfg.eval.zeroshot_index or None
    assert train is not None or cfg.data.sources, "validate() requires data.train or data.sources"
    return DataSources(train or [], train_index, heldout, heldout_index, zeroshot, zeroshot_index)


def _opening(field: str) -> Callable[..., object]:
    """The loader constructor, with failures (missing shards, an index that does not match them)
    reported as config errors naming the field."""
    from shardstream import ShardError, ShardLoader

    def create(*args: object, **kwargs: object) -> object:
        try:
            return ShardLoader(*args, **kwargs)  # type: ignore[arg-type]
        except (ShardError, ValueError, OSError) as e:
            raise ConfigError(f"{field}: cannot open the shards: {e}") from None

    return create


def mixture_sources(cfg: Config) -> list[object]:
    """``data.sources`` as shardstream.Source objects (empty: no mixture)."""
    from shardstream import Source

    out = []
    for i, s in enumerate(cfg.data.sources):
        try:
            out.append(
                Source(
                    index=s.index,
                    urls=s.urls or None,
                    weight=None if s.samples_per_epoch else s.weight,
                    samples_per_epoch=s.samples_per_epoch or None,
                    caption_key=s.caption_key or None,
                    name=s.name or None,
                    keys=s.keys or None,
                    uids=s.uids or None,
                    filter=s.filter or None,
                    metadata=s.metadata,
                )
            )
        except ValueError as e:
            raise ConfigError(f"data.sources[{i}]: {e}") from None
    return out


def train_loader(
    cfg: Config, sources: DataSources, image_size: int, ctx: DistContext, context_length: int | None = None
) -> object:
    mixture = mixture_sources(cfg)
    return _opening("data.sources" if mixture else "data.train")(
        None if mixture else sources.train,
        sources=mixture or None,
        batch_size=cfg.train.batch_size,
        image_size=image_size,
        seed=cfg.train.seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        threads=cfg.data.threads or None,
        rank=ctx.rank,
        world_size=ctx.world_size,
        index=None if mixture else sources.train_index,
        drop_last=True,  # every rank takes the same number of full steps
        on_error=cfg.data.on_error,
        caption_key=cfg.data.caption_key,
        crop=cfg.data.crop,
        random_crop_scale=(cfg.data.crop_scale[0], cfg.data.crop_scale[1]),
        random_crop_ratio=(cfg.data.crop_ratio[0], cfg.data.crop_ratio[1]),
        samples_per_epoch=cfg.data.samples_per_epoch or None,
        **(loader_tokenizer(cfg, context_length) if cfg.data.tokenize_in_loader else {}),
    )


def loader_tokenizer(cfg: Config, context_length: int | None) -> dict[str, object]:
    """The loader's tokenizer arguments, so that captions are tokenized in its Rust threads
    (``batch.tokens``) and the training step never tokenizes in Python: ``model.tokenizer`` (a
    tokenizer.json) at the model's context length, or the model's own name when the Rust pipeline
    reproduces its tokenizer (open_clip's CLIP BPE). Empty for any other: the step then tokenizes
    ``batch.texts`` itself with the model's tokenizer."""
    from shardstream.tokenizer import resolve_tokenizer

    if cfg.model.tokenizer:
        from shardstream.train.model import tokenizer_json_path

        args: dict[str, object] = {"tokenizer": tokenizer_json_path(cfg.model.tokenizer)}
        if context_length:
            args["context_length"] = context_length
        return args
    try:
        resolve_tokenizer(cfg.model.name)
    except (ValueError, RuntimeError):
        return {}
    return {"tokenizer": cfg.model.name}


def evaluation_loader(
    cfg: Config,
    field: str,
    urls: object,
    index: str | None,
    image_size: int,
    ctx: DistContext,
    **options: object,
) -> object:
    """Every sample of an evaluation set once across ranks, unshuffled, center-cropped, nothing
    dropped. With an index the ranks split the set exactly. Without one an exact split is
    impossible, so rank 0 reads all of it and the other ranks contribute nothing (correct, only
    slower). ``field`` names the setting in errors; ``options``: the set's caption key, tokenizer."""
    rank, world_size = ctx.rank, ctx.world_size
    if index is None and world_size > 1:
        if rank != 0:
            return []
        rank, world_size = 0, 1
    return _opening(field)(
        urls,
        batch_size=cfg.eval.batch_size,
        image_size=image_size,
        seed=0,
        shuffle_buffer=1,
        threads=cfg.data.threads or None,
        rank=rank,
        world_size=world_size,
        index=index,
        drop_last=False,
        on_error=cfg.data.on_error,
        crop="center",
        **options,
    )


def heldout_loader(
    cfg: Config, sources: DataSources, image_size: int, ctx: DistContext, context_length: int | None = None
) -> object:
    """The held-out shards as an evaluation loader, tokenized as the training loader is."""
    assert sources.heldout is not None
    return evaluation_loader(
        cfg,
        "data.heldout",
        sources.heldout,
        sources.heldout_index,
        image_size,
        ctx,
        caption_key=cfg.data.caption_key,
        **(loader_tokenizer(cfg, context_length) if cfg.data.tokenize_in_loader else {}),
    )
