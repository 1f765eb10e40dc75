"""The training configuration: its schema (fields, types, defaults, documentation) lives here and
nowhere else. YAML files (the shipped ones in ``shardstream/train/configs/``, chosen by name:
``--config vit_b32``) and command-line overrides (``--train.batch_size 64``) are checked against
it; a bad value or unknown field raises ``ConfigError`` naming the field.

Defaults are those of the small CPU demo (the shipped ``demo_cpu`` config).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardstream.config import DEFAULTS


class ConfigError(ValueError):
    """A configuration problem; the message names the field (``section.name``)."""


def _f(default: Any, doc: str, **kwargs: Any) -> Any:
    """A field with its documentation attached (shown by ``--help-config``)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc}, **kwargs)
    return field(default=default, metadata={"doc": doc}, **kwargs)


@dataclass
class ModelConfig:
    """The open_clip model."""

    name: str = _f(
        "shardstream-tiny",
        "open_clip model name (see open_clip.list_models()), e.g. ViT-B-32; shardstream adds "
        "'shardstream-tiny' (a 64 px ViT for the CPU demo)",
    )
    pretrained: str = _f("", "open_clip pretrained tag or local weights file; empty: random initialisation")
    precision: Literal["bf16", "fp16", "fp32", "pure_bf16"] = _f(
        "bf16",
        "bf16: autocast to bfloat16 (weights and optimizer stay fp32); fp16: autocast to float16 with "
        "dynamic loss scaling (GradScaler; overflowing steps are skipped and counted in the log); "
        "fp32: no autocast; pure_bf16: weights, gradients and optimizer state in bfloat16 (half the "
        "memory; open_clip's pure_bf16), initialised in fp32 first so the weights match the other modes'",
    )
    grad_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    loss: Literal["auto", "clip", "siglip", "coca"] = _f(
        "auto",
        "auto: from the model (a CoCa model: coca; a logit bias, i.e. init_logit_bias in its config: "
        "siglip; else clip); a choice that leaves parameters untrained is refused at start",
    )
    siglip_exchange: Literal["neighbour", "gather"] = _f(
        "neighbour",
        "SigLIP across ranks: neighbour passes text features around the ring (W-1 exchanges, one "
        "neighbour's block held at a time; open_clip's bidir); gather all-gathers them once",
    )
    coca_contrastive_weight: float = _f(
        1.0, "CoCa: weight of the contrastive term (open_clip_train's default)"
    )
    coca_caption_weight: float = _f(2.0, "CoCa: weight of the caption term (open_clip_train's default)")
    lock_image: bool = _f(
        False, "freeze the image tower (LiT: a pretrained image tower, a text tower trained to it)"
    )
    lock_image_unlocked_groups: int = _f(0, "with lock_image: leave this many last layer groups trainable")
    lock_image_freeze_bn_stats: bool = _f(
        False, "with lock_image: also freeze BatchNorm statistics (timm towers)"
    )
    lock_text: bool = _f(False, "freeze the text tower")
    lock_text_unlocked_layers: int = _f(0, "with lock_text: leave this many last layers trainable")
    lock_text_freeze_layer_norm: bool = _f(True, "with lock_text: also freeze its LayerNorms")
    tokenizer: str = _f(
        "",
        "a tokenizer.json file or a Hugging Face tokenizer folder holding one, run by the loader's "
        "Rust tokenizers path and for evaluation (context length: the model's); empty: the model's "
        "own (open_clip's CLIP BPE in the loader; a Hugging Face one needs transformers and its files)",
    )


@dataclass
class SourceConfig:
    """One dataset of a training mixture (``data.sources``): the fields of shardstream.Source."""

    index: str = _f("", "the source's index (shardstream index or shardstream subset -o); required")
    urls: str = _f("", "where to open its shards instead of the index's URLs (optional)")
    weight: float = _f(1.0, "its share of the epoch's samples not fixed by samples_per_epoch")
    samples_per_epoch: int = _f(0, "exactly this many samples of it every epoch (then weight is ignored)")
    caption_key: str = _f("", "its caption member; empty: data.caption_key")
    name: str = _f("", "its label in the log's samples_by_source; empty: its position")
    keys: str = _f("", "a file of keys (one per line): train on those samples only")
    uids: str = _f("", "DataComp uids (.npy, .parquet or one per line): train on those samples only")
    filter: str = _f("", "a filter on its metadata, e.g. 'similarity >= 0.28 and width >= 200'")
    metadata: Literal["json", "parquet"] = _f("json", "where filter and uid fields come from")


@dataclass
class DataConfig:
    """Training and held-out shards, read by shardstream.ShardLoader."""

    train: str = _f(
        "demo",
        "training shards: a URL spec (path, brace range {000..099}, http(s)://, s3://, lists joined "
        "by '::'); 'demo' is the embedded demo set, generated under data.demo_dir if absent",
    )
    train_index: str = _f(
        "",
        "index of the training shards (shardstream index) for exact epochs; built automatically for 'demo'",
    )
    heldout: str = _f(
        "demo", "held-out shards for evaluation, same syntax as data.train; empty: no evaluation"
    )
    heldout_index: str = _f("", "index of the held-out shards; built automatically for 'demo'")
    demo_dir: str = _f("data/demo", "where the demo dataset is generated (relative to the working directory)")
    image_size: int = _f(0, "decoded image side in pixels; 0: the model's own input size")
    crop: Literal["center", "random"] = _f(
        "center",
        "center: resize the shorter side, crop the middle square; random: a random-resized crop whose "
        "area is a fraction in data.crop_scale of the image (open_clip's training transform)",
    )
    crop_scale: list[float] = _f(
        list(DEFAULTS.random_crop_scale),
        "with crop random: the range of the crop's area as a fraction of the image (open_clip's)",
    )
    crop_ratio: list[float] = _f(
        list(DEFAULTS.random_crop_ratio),
        "with crop random: the range of the crop's aspect ratio, width / height (torchvision's)",
    )
    sample: Literal["square", "naflex"] = _f(
        "square",
        "the sample kind: square: each image resized and cropped to data.image_size (what open_clip's "
        "models take); naflex: each image at its own aspect ratio as a sequence of patches "
        "(shardstream.NaFlex), refused at start, since no released open_clip model takes it (SigLIP 2 "
        "NaFlex trains through transformers' Siglip2Model: the native-resolution guide)",
    )
    shuffle_buffer: int = _f(2048, "samples held by each rank's shuffle buffer (memory vs randomness)")
    threads: int = _f(0, "decode threads per rank; 0: the loader's default")
    caption_key: str = _f(DEFAULTS.caption_key, "the sample member holding the caption")
    tokenize_in_loader: bool = _f(
        True,
        "tokenize captions in the loader's Rust threads (open_clip's CLIP BPE, token-identical); "
        "false: in the training process",
    )
    samples_per_epoch: int = _f(
        0,
        "global samples per epoch when no index is given (streaming mode, as open_clip's train_num_samples)",
    )
    on_error: Literal["skip", "raise"] = _f("skip", "corrupt samples: skip and count them, or stop")
    sources: list[SourceConfig] = _f(
        [],
        "a mixture instead of data.train: a list of sources (index, weight or samples_per_epoch, and "
        "optionally urls, caption_key, name, keys, uids, filter, metadata), planned as one exact "
        "epoch of data.samples_per_epoch samples (0: all of theirs) with every batch holding each "
        "source in proportion",
    )


@dataclass
class TrainConfig:
    """The training run."""

    output_dir: str = _f("runs/demo", "run folder: config.yaml, log.jsonl, tensorboard/, checkpoints/")
    batch_size: int = _f(64, "samples per device per micro-batch (the loader's batch size)")
    accum_steps: int = _f(
        1, "micro-batches per optimizer step; the contrastive loss sees all of them (exact, as one big batch)"
    )
    epochs: int = _f(8, "passes over the training set")
    max_steps: int = _f(0, "optimizer steps of the whole schedule; 0: epochs x steps per epoch")
    stop_at_step: int = _f(
        0, "end this run after this step, with a checkpoint, leaving the schedule unchanged (job time limits)"
    )
    seed: int = _f(
        0,
        "seed of the model initialisation (the same on every rank) and the data order; dropout, "
        "patch dropout and other random draws use a stream per rank derived from it",
    )
    compile: bool = _f(
        False,
        "torch.compile the model (inductor; the first steps pay the compilation, a C/C++ compiler "
        "is needed on the CPU); checkpoints hold the plain model's weights, so resume is exact",
    )
    tf32: bool = _f(True, "on CUDA, TF32 matmuls and convolutions (Ampere and later); no effect on the CPU")
    grad_clip_norm: float = _f(1.0, "clip the gradient norm to this value; 0: no clipping")
    torch_threads: int = _f(0, "torch intra-op threads per process; 0: cores / local processes")
    resume: str = _f(
        "", "'latest' (the newest checkpoint in checkpoint.dir), a checkpoint file or s3:// URL, or empty"
    )
    callbacks: list[str] = _f(
        [], "extra callbacks, as 'package.module:ClassName' (constructed with no arguments)"
    )


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    optimizer: Literal["adamw", "sgd"] = _f("adamw", "adamw or sgd (momentum, nesterov)")
    base_lr: float = _f(2e-3, "learning rate at the global batch optim.base_batch")
    base_batch: int = _f(128, "the global batch size base_lr was tuned for")
    lr_scaling: Literal["auto", "sqrt", "linear", "none"] = _f(
        "auto",
        "lr = base_lr * scale(global_batch / base_batch); auto: sqrt for adamw, linear for sgd",
    )
    weight_decay: float = _f(
        0.1,
        "decoupled weight decay; never applied to gains, biases, the logit scale and bias, the "
        "tensors the model's no_weight_decay() names (positional and class embeddings), and optim.no_decay",
    )
    no_decay: list[str] = _f(
        [], "more parameters without weight decay: fnmatch patterns of their names, e.g. '*.cls_emb'"
    )
    betas: list[float] = _f([0.9, 0.98], "AdamW betas")
    eps: float = _f(1e-6, "AdamW epsilon")
    momentum: float = _f(0.9, "SGD momentum")
    warmup_steps: int = _f(50, "linear warmup from 0 to the peak learning rate")
    schedule: Literal["cosine", "constant", "const-cooldown"] = _f(
        "cosine",
        "after warmup: cosine decay; constant; or const-cooldown (constant, then a decay over the last "
        "optim.cooldown_steps steps to min_lr_ratio, open_clip's const-cooldown)",
    )
    min_lr_ratio: float = _f(0.0, "floor of the decay (cosine, cooldown), as a fraction of the peak rate")
    cooldown_steps: int = _f(0, "const-cooldown: steps of the final decay")
    cooldown_power: float = _f(1.0, "const-cooldown: shape of the decay (1: linear, as open_clip's default)")


@dataclass
class EvalConfig:
    """Evaluation across ranks, each sample once: retrieval recall@k and validation loss on the
    held-out shards, zero-shot classification on a labelled set."""

    every_steps: int = _f(0, "evaluate every this many steps; 0: only at the end")
    at_end: bool = _f(True, "evaluate when training ends")
    batch_size: int = _f(
        128, "samples per device per evaluation batch (the validation loss is that of such batches)"
    )
    zeroshot: str = _f(
        "demo",
        "labelled set for zero-shot top-1/top-5, in CLIP_benchmark's webdataset layout: a folder or "
        "http(s)/s3 URL with classnames.txt, zeroshot_classification_templates.txt ({c} for the "
        "class name) and SPLIT/nshards.txt, SPLIT/0.tar ... (image + cls member); without either "
        "text file OpenAI's ImageNet class names / 80 templates; 'demo': the demo's; empty: none",
    )
    zeroshot_split: str = _f("test", "the labelled set's split folder")
    zeroshot_index: str = _f(
        "",
        "index of the labelled set's shards (shardstream index SPLIT/{0..N}.tar --caption-key cls -o "
        "INDEX) for an exact split across ranks; "
        "empty: rank 0 classifies all of it; 'demo' has its own",
    )
    recall_k: list[int] = _f([1, 5], "k values of image-to-text and text-to-image recall@k")


# How the background checkpoint write is scheduled (shardstream.train.checkpoint_async).
WriterPriority = Literal["idle", "low", "normal"]


@dataclass
class CheckpointConfig:
    """Checkpoints (model, optimizer, scheduler, RNG and loader state), written atomically."""

    every_steps: int = _f(200, "write a checkpoint every this many steps; 0: only at the end")
    at_end: bool = _f(True, "write a checkpoint when training ends")
    keep: int = _f(2, "step checkpoints to keep (older ones are deleted); 0: keep all")
    dir: str = _f(
        "",
        "where checkpoints go: empty (output_dir/checkpoints), a local folder, or s3://BUCKET/PREFIX "
        "(boto3's credentials, AWS_ENDPOINT_URL; nodes need no shared filesystem)",
    )
    async_write: bool = _f(
        True,
        "snapshot the state to host memory at the step and write it on a background thread while "
        "training goes on (one write in flight; a failed write is an error at the next checkpoint or at "
        "the end); false: every rank waits for the write. dist.strategy fsdp always writes its shards "
        "synchronously",
    )
    writer_priority: WriterPriority = _f(
        "idle",
        "CPU priority of the background write (Linux): idle runs it only on cores nothing else wants "
        "(SCHED_IDLE: the steps keep their speed; on a saturated CPU the write waits for gaps, or for "
        "the next checkpoint or the end, which wait for it); low: 10 nice levels below training; "
        "normal: the training thread's",
    )
    flush_timeout_s: float = _f(
        120.0,
        "at the end of the run (also after SIGTERM) wait at most this long for the last checkpoint "
        "write, then fail naming it; keep it inside the scheduler's grace period; 0: no bound",
    )


@dataclass
class LogConfig:
    """Per-step metrics: log.jsonl, TensorBoard, console."""

    every_steps: int = _f(
        10,
        "log every this many steps: the device values of the steps since the last log (loss, grad norm, "
        "logit scale) are read then, in one transfer, so no step waits for the device just to log; "
        "log.jsonl still gets every step, the console one line per log",
    )
    tensorboard: bool = _f(True, "also write TensorBoard events under output_dir/tensorboard")
    wandb: bool = _f(
        False,
        "also log to Weights & Biases (rank 0; WANDB_MODE=offline writes output_dir/wandb); the run id is "
        "kept in the checkpoint, so a resumed run continues the same wandb run",
    )
    wandb_project: str = _f("shardstream", "the wandb project")
    wandb_name: str = _f("", "the wandb run name; empty: wandb chooses one")
    wandb_entity: str = _f("", "the wandb entity (team or user); empty: the default one")
    wandb_tags: list[str] = _f([], "wandb run tags")
    progress: Literal["auto", "on", "off"] = _f("auto", "progress bar: auto shows it on a terminal only")
    log_keys: bool = _f(False, "add the sample keys of every step (rank 0's micro-batches) to log.jsonl")


@dataclass
class DistConfig:
    """torch.distributed (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR ...)."""

    backend: Literal["auto", "nccl", "gloo"] = _f("auto", "auto: nccl on CUDA GPUs, gloo on CPU")
    strategy: Literal["ddp", "fsdp"] = _f(
        "ddp",
        "ddp: DistributedDataParallel, a full copy of the weights and optimizer state on every rank, "
        "checkpoints as one file; fsdp: FSDP2 (fully_shard per transformer block and the root), the "
        "weights, gradients and optimizer state sharded over the ranks, checkpoints as a sharded DCP "
        "folder (step-N.dcp) that resumes on any number of ranks; not with fp16, train.compile or "
        "locked towers",
    )
    timeout_s: int = _f(1800, "collective timeout in seconds")
    join_timeout_s: int = _f(
        120,
        "joining the process group (store, then every peer) must finish within this many seconds; "
        "otherwise the process exits with an error naming what it waited for, so that torchrun can "
        "restart the workers instead of hanging until the collective timeout",
    )


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = dict(typing.get_type_hints(Config))


def _fields(section: type) -> dict[str, tuple[Any, dataclasses.Field[Any]]]:
    hints = typing.get_type_hints(section)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(section)}


# -- value checking -------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(name: str, tp: Any, value: Any, *, from_text: bool) -> Any:
    """``value`` as type ``tp``, or ConfigError naming ``name``. ``from_text``: the value is a
    command-line string, parsed according to the field's type (so '64' is an int for an int field
    and stays a string for a str field)."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{name}: expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin is list:
        if from_text:
            import yaml  # pyyaml: part of shardstream[train], imported when needed

            value = yaml.safe_load(value) if value.strip() else []
            if not isinstance(value, list):
                value = [value]
        if not isinstance(value, list):
            raise bad
        (item_type,) = typing.get_args(tp)
        return [_coerce(f"{name}[{i}]", item_type, v, from_text=False) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        fields = _fields(tp)
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise _unknown(f"{name}.{unknown[0]}", [f"{name}.{k}" for k in fields])
        return tp(**{k: _coerce(f"{name}.{k}", fields[k][0], v, from_text=False) for k, v in value.items()})
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"{name}: union types are not supported by the config loader")
    if tp is bool:
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise bad
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                raise bad from None
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '1e-3' as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if not from_text and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise bad
    raise TypeError(f"{name}: unsupported field type {tp!r}")


def _unknown(name: str, choices: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config field {name!r}{hint}")


def _all_names() -> list[str]:
    return [f"{s}.{n}" for s, cls in SECTIONS.items() for n in _fields(cls)]


# -- range checks ---------------------------------------------------------------------------------


def validate(cfg: Config) -> Config:
    """Range and consistency checks beyond types; raises ConfigError naming the field."""

    def require(ok: bool, name: str, message: str) -> None:
        if not ok:
            section, attr = name.split(".")
            value = getattr(getattr(cfg, section), attr)
            raise ConfigError(f"{name}: {message}, got {value!r}")

    require(cfg.train.batch_size >= 1, "train.batch_size", "must be >= 1")
    require(cfg.train.accum_steps >= 1, "train.accum_steps", "must be >= 1")
    require(cfg.train.epochs >= 1, "train.epochs", "must be >= 1")
    require(cfg.train.max_steps >= 0, "train.max_steps", "must be >= 0")
    require(cfg.train.stop_at_step >= 0, "train.stop_at_step", "must be >= 0")
    require(cfg.train.grad_clip_norm >= 0, "train.grad_clip_norm", "must be >= 0")
    require(cfg.train.torch_threads >= 0, "train.torch_threads", "must be >= 0")
    require(bool(cfg.train.output_dir), "train.output_dir", "must not be empty")
    require(
        bool(cfg.data.train or cfg.data.sources), "data.train", "must name the training shards (or 'demo')"
    )
    require(cfg.data.image_size >= 0, "data.image_size", "must be >= 0 (0: the model's size)")
    require(cfg.data.shuffle_buffer >= 0, "data.shuffle_buffer", "must be >= 0")
    require(cfg.data.threads >= 0, "data.threads", "must be >= 0")
    require(cfg.data.samples_per_epoch >= 0, "data.samples_per_epoch", "must be >= 0")
    require(cfg.optim.base_lr > 0, "optim.base_lr", "must be > 0")
    require(cfg.optim.base_batch >= 1, "optim.base_batch", "must be >= 1")
    require(cfg.optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    require(
        len(cfg.optim.betas) == 2 and all(0 <= b < 1 for b in cfg.optim.betas),
        "optim.betas",
        "must be two numbers in [0, 1)",
    )
    require(cfg.optim.eps > 0, "optim.eps", "must be > 0")
    require(0 <= cfg.optim.momentum < 1, "optim.momentum", "must be in [0, 1)")
    require(cfg.optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    require(
        len(cfg.data.crop_scale) == 2 and 0 < cfg.data.crop_scale[0] <= cfg.data.crop_scale[1] <= 1,
        "data.crop_scale",
        "must be two fractions 0 < low <= high <= 1",
    )
    require(
        len(cfg.data.crop_ratio) == 2 and 0 < cfg.data.crop_ratio[0] <= cfg.data.crop_ratio[1] < math.inf,
        "data.crop_ratio",
        "must be two aspect ratios 0 < low <= high",
    )
    require(cfg.optim.cooldown_steps >= 0, "optim.cooldown_steps", "must be >= 0")
    require(cfg.optim.cooldown_power > 0, "optim.cooldown_power", "must be > 0")
    require(
        cfg.optim.schedule != "const-cooldown" or cfg.optim.cooldown_steps > 0,
        "optim.cooldown_steps",
        "must be > 0 with optim.schedule const-cooldown",
    )
    require(cfg.model.lock_image_unlocked_groups >= 0, "model.lock_image_unlocked_groups", "must be >= 0")
    require(cfg.model.lock_text_unlocked_layers >= 0, "model.lock_text_unlocked_layers", "must be >= 0")
    require(0 <= cfg.optim.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")
    require(cfg.eval.every_steps >= 0, "eval.every_steps", "must be >= 0")
    require(cfg.eval.batch_size >= 1, "eval.batch_size", "must be >= 1")
    require(
        bool(cfg.eval.recall_k) and all(k >= 1 for k in cfg.eval.recall_k),
        "eval.recall_k",
        "must be a non-empty list of integers >= 1",
    )
    require(cfg.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0")
    require(cfg.checkpoint.keep >= 0, "checkpoint.keep", "must be >= 0")
    require(cfg.checkpoint.flush_timeout_s >= 0, "checkpoint.flush_timeout_s", "must be >= 0")
    require(
        not cfg.checkpoint.dir or cfg.checkpoint.dir.startswith("s3://") or "://" not in cfg.checkpoint.dir,
        "checkpoint.dir",
        "a local folder or s3://BUCKET/PREFIX",
    )
    require(cfg.model.coca_contrastive_weight >= 0, "model.coca_contrastive_weight", "must be >= 0")
    require(cfg.model.coca_caption_weight > 0, "model.coca_caption_weight", "must be > 0")
    require(cfg.log.every_steps >= 1, "log.every_steps", "must be >= 1")
    require(cfg.dist.timeout_s >= 1, "dist.timeout_s", "must be >= 1")
    require(cfg.dist.join_timeout_s >= 1, "dist.join_timeout_s", "must be >= 1")
    if cfg.dist.strategy == "fsdp":
        # fp16: GradScaler does not unscale DTensor gradients (FSDP2 has no sharded scaler here);
        # compile and locked towers: not verified with FSDP2 in this trainer, refused rather than guessed.
        for on, what in (
            (cfg.model.precision == "fp16", "model.precision fp16 (use bf16, fp32 or pure_bf16)"),
            (cfg.train.compile, "train.compile"),
            (cfg.model.lock_image, "model.lock_image"),
            (cfg.model.lock_text, "model.lock_text"),
        ):
            if on:
                raise ConfigError(f"dist.strategy: fsdp does not support {what}; use dist.strategy ddp")
    for i, spec in enumerate(cfg.train.callbacks):
        if spec.count(":") != 1 or not all(spec.split(":")):
            raise ConfigError(f"train.callbacks[{i}]: expected 'package.module:ClassName', got {spec!r}")
    require(
        bool(cfg.eval.zeroshot_split) and "/" not in cfg.eval.zeroshot_split,
        "eval.zeroshot_split",
        "must name one split folder",
    )
    if cfg.data.sample == "naflex":
        raise ConfigError(_naflex_refusal())
    for i, source in enumerate(cfg.data.sources):
        if not source.index:
            raise ConfigError(f"data.sources[{i}].index: every source of a mixture needs its index")
    if cfg.data.sources and (cfg.data.train not in ("", "demo") or cfg.data.train_index):
        raise ConfigError(
            "data.sources: a mixture replaces data.train and data.train_index; leave those unset"
        )
    if (
        not cfg.data.sources
        and cfg.data.train != "demo"
        and not cfg.data.train_index
        and not cfg.data.samples_per_epoch
    ):
        raise ConfigError(
            "data.train_index: without an index the epoch length is unknown and ranks could get unequal "
            "batches; give data.train_index (shardstream index) or data.samples_per_epoch"
        )
    return cfg


def _naflex_refusal() -> str:
    """The one line that refuses ``data.sample naflex``: what is missing (a model of this trainer's
    that takes patch sequences) and where that kind does train."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        open_clip = f"open_clip {version('open_clip_torch')}"
    except PackageNotFoundError:
        open_clip = "open_clip (not installed)"
    # The trainer builds open_clip models only, and every released open_clip model takes square
    # [B, 3, S, S] images: NaFlex needs one that takes pixel_values [B, N, 3*p*p] with its mask
    # and spatial_shapes.
    return (
        f"data.sample: naflex needs a model that takes patch sequences, and this trainer's models "
        f"({open_clip}) take square images only; train SigLIP 2 NaFlex through transformers' "
        "Siglip2Model with shardstream.integrations.hf.ShardTrainer and Siglip2Collator"
    )


# -- loading --------------------------------------------------------------------------------------


def _apply(cfg: Config, name: str, value: Any, *, from_text: bool) -> None:
    section_name, _, attr = name.partition(".")
    if section_name not in SECTIONS or not attr or "." in attr:
        raise _unknown(name, _all_names())
    fields = _fields(SECTIONS[section_name])
    if attr not in fields:
        raise _unknown(name, _all_names())
    tp, _ = fields[attr]
    setattr(getattr(cfg, section_name), attr, _coerce(name, tp, value, from_text=from_text))


def config_from_dict(data: dict[str, Any], *, source: str = "config") -> Config:
    """A Config from nested mappings (a parsed YAML file); unset fields keep their defaults."""
    cfg = Config()
    if data is None:
        return cfg
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}), got {data!r}")
    for section_name, values in data.items():
        if section_name not in SECTIONS:
            raise _unknown(str(section_name), list(SECTIONS))
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{section_name}: expected a mapping of fields, got {values!r}")
        for attr, value in values.items():
            _apply(cfg, f"{section_name}.{attr}", value, from_text=False)
    return cfg


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """``['--train.batch_size', '64', '--log.tensorboard=false']`` -> [(name, text), ...]."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError(
                f"unexpected argument {arg!r}: overrides look like --section.field VALUE "
                "(e.g. --train.batch_size 64)"
            )
        if "=" in arg:
            name, text = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"{arg[2:]}: missing value after {arg}")
            name, text = arg[2:], args[i + 1]
            i += 2
        pairs.append((name, text))
    return pairs


# The configs shipped inside the package (in the wheel): --config NAME picks NAME.yaml here.
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"
# A shipped config's value that the user must replace (their data's location) starts with this.
PLACEHOLDER = "<SET ME"


def shipped_configs() -> dict[str, Path]:
    """The configs shipped with the package, by name (``vit_b32``: ``configs/vit_b32.yaml``)."""
    return {p.stem: p for p in sorted(SHIPPED_CONFIGS.glob("*.yaml"))}


def resolve_config(name_or_path: str | Path) -> Path:
    """The config file that ``--config`` names: a path to a file, else the name of a shipped
    config (with or without ``.yaml``). Raises ConfigError listing the shipped names."""
    path = Path(name_or_path)
    if path.is_file() or path.parent != Path("."):
        return path  # a path: load_config says if it cannot be read
    shipped = shipped_configs()
    name = path.name.removesuffix(".yaml")
    if name in shipped:
        return shipped[name]
    if path.suffix in (".yaml", ".yml"):
        return path
    raise ConfigError(
        f"--config {str(name_or_path)!r}: no such file, and no shipped config of that name "
        f"(shipped: {', '.join(shipped)})"
    )


def placeholders(cfg: Config) -> list[str]:
    """One line per setting that still holds a shipped config's placeholder (``<SET ME: ...>``):
    the location of the user's own data, which no config can know."""
    found = []
    for section_name in SECTIONS:
        section = getattr(cfg, section_name)
        for name in _fields(type(section)):
            value = getattr(section, name)
            if isinstance(value, str) and value.startswith(PLACEHOLDER):
                found.append(
                    f"{section_name}.{name} is the config's placeholder {value!r}: set it "
                    f"with --{section_name}.{name} VALUE or in the YAML file"
                )
    return found


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """The YAML file at ``path`` (or the defaults), then ``overrides`` (command-line style),
    type-checked and range-checked. ``path`` may name a shipped config (``"vit_b32"``)."""
    if path is not None:
        path = resolve_config(path)
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
        cfg = config_from_dict(data, source=str(path))
    else:
        cfg = Config()
    for name, text in parse_overrides(overrides or []):
        _apply(cfg, name, text, from_text=True)
    return validate(cfg)


def config_to_yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def describe_config() -> str:
    """Every field with its type, default and documentation (``train_clip.py --help-config``)."""
    lines = []
    for section_name, cls in SECTIONS.items():
        lines.append(f"{section_name}:  # {(cls.__doc__ or '').strip()}")
        for attr, (tp, f) in _fields(cls).items():
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"  {attr}: {default!r}  # ({_describe(tp)}) {f.metadata.get('doc', '')}")
    return "\n".join(lines)
