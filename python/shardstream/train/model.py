"""open_clip model, tokenizer, on-device image normalisation and the optimizer's parameter groups."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from shardstream.train.config import ConfigError, ModelConfig

MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")


def register_model_configs() -> None:
    """Adds shardstream's model configs (``shardstream-tiny``...) to open_clip's registry."""
    import open_clip

    if not any(name.startswith("shardstream-") for name in open_clip.list_models()):
        open_clip.add_model_config(MODEL_CONFIG_DIR)


@dataclass
class ModelBundle:
    model: torch.nn.Module  # open_clip CLIP returning a dict (image_features, text_features, logit_scale)
    tokenizer: Callable[[list[str]], torch.Tensor]
    image_size: int
    mean: torch.Tensor  # [1, 3, 1, 1] on the device
    std: torch.Tensor
    context_length: int | None = None  # the text tower's token count (tokens are [B, context_length])
    dtype: torch.dtype = torch.float32  # the weights' (bfloat16 for pure_bf16)

    def normalise(self, images: torch.Tensor, device: torch.device) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> normalised images on ``device``, in the weights' dtype. Done on the
        device so that only uint8 crosses PCIe (a quarter of float32)."""
        x = images.to(device, non_blocking=True).float().div_(255.0)
        x = x.sub_(self.mean).div_(self.std)
        return x if self.dtype == torch.float32 else x.to(self.dtype)


def hf_tokenizer_name(name: str) -> str | None:
    """The Hugging Face tokenizer an open_clip model config names (``text_cfg.hf_tokenizer_name``,
    e.g. SigLIP's), or None for open_clip's own CLIP BPE; read from the config, nothing built."""
    import open_clip

    register_model_configs()
    config = open_clip.get_model_config(name) or {}
    return (config.get("text_cfg") or {}).get("hf_tokenizer_name") or None


def tokenizer_json_path(spec: str) -> str:
    """``model.tokenizer``: a tokenizer.json file, or a folder holding one (a Hugging Face
    tokenizer folder); ConfigError naming it otherwise."""
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(
            f"model.tokenizer: {spec!r} is neither a tokenizer.json file nor a folder holding one"
        )
    return str(path)


def _json_tokenizer(path: str, context_length: int) -> Callable[[list[str]], torch.Tensor]:
    """The loader's Rust tokenizer of a tokenizer.json, as a callable on captions (evaluation
    prompts, or captions when the loader does not tokenize): the same tokens the loader makes."""
    import numpy as np

    from shardstream.tokenizer import rust_tokenizer_of

    try:
        rust = rust_tokenizer_of(("json", path, context_length))
    except (ValueError, OSError) as e:
        raise ConfigError(f"model.tokenizer: {e}") from None

    def tokenize(texts: list[str]) -> torch.Tensor:
        out = np.zeros((len(texts), context_length), dtype=np.int64)
        if texts:
            rust.tokenize_into(list(texts), out.ctypes.data, out.size)
        return torch.from_numpy(out)

    return tokenize


def _model_tokenizer(
    name: str, tokenizer: str, context_length: int | None
) -> Callable[[list[str]], torch.Tensor]:
    import open_clip

    if tokenizer:
        return _json_tokenizer(tokenizer_json_path(tokenizer), context_length or 77)
    hf_name = hf_tokenizer_name(name)
    try:
        return open_clip.get_tokenizer(name)
    except (ImportError, OSError, ValueError) as e:
        if hf_name is None:
            raise
        raise ConfigError(missing_hf_tokenizer(name, hf_name, e)) from None


def missing_hf_tokenizer(name: str, hf_name: str, error: BaseException | None = None) -> str:
    """The one line a rank prints when a model's Hugging Face tokenizer cannot be had."""
    why = (
        f" ({type(error).__name__}: {str(error).strip().splitlines()[0]})"
        if error and str(error).strip()
        else ""
    )
    return (
        f"model.name: {name} tokenizes with the Hugging Face tokenizer {hf_name!r}, which needs the "
        f"transformers package and that tokenizer's files in the Hugging Face cache{why}; install "
        "transformers and fetch the files, or set model.tokenizer to a local tokenizer.json or "
        "tokenizer folder"
    )


def initialise_caption_decoder(model: torch.nn.Module) -> None:
    """open_clip 3.3's CoCa decoder (``MultimodalTransformer``) makes ``text_projection`` with
    ``torch.empty`` and never initialises it (its ``init_parameters``, which would, is never called
    and fails if called), so it holds whatever the allocator had there: zeros in a fresh process,
    1e30 or NaN after other tensors were freed, and a CoCa model trained from scratch can start
    from garbage. Here it gets the normal(0, width**-0.5) that code means to give it, drawn from the
    seeded stream."""
    decoder = getattr(model, "text_decoder", None)
    projection = getattr(decoder, "text_projection", None)
    if isinstance(projection, torch.nn.Parameter):
        with torch.no_grad():
            torch.nn.init.normal_(projection, std=int(decoder.width) ** -0.5)  # type: ignore[union-attr]


def create_model(
    name: str,
    *,
    pretrained: str,
    device: torch.device,
    grad_checkpointing: bool = False,
    image_size: int | None = None,
    tokenizer: str = "",
    precision: str = "fp32",
) -> ModelBundle:
    """An open_clip model in fp32 (autocast does the low-precision part), its tokenizer and its
    normalisation constants; ``image_size`` rebuilds it for another input size; ``tokenizer``: a
    tokenizer.json (or folder) to tokenize with instead of the model's own. ``pure_bf16`` casts the
    fp32-initialised weights to bfloat16."""
    import open_clip

    register_model_configs()
    if name not in open_clip.list_models():
        raise ConfigError(
            f"model.name: unknown open_clip model {name!r}; known: shardstream-tiny, ViT-B-32, ... "
            "(open_clip.list_models())"
        )
    # The tokenizer first: a missing Hugging Face tokenizer fails in a second, not after building
    # a large model. Its context length is the text tower's (open_clip's config, default 77).
    text_cfg = (open_clip.get_model_config(name) or {}).get("text_cfg") or {}
    context_length = int(text_cfg.get("context_length", 77))
    tokenize = _model_tokenizer(name, tokenizer, context_length)
    # open_clip warns at WARNING level when no pretrained weights are loaded: expected here.
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        model = open_clip.create_model(
            name,
            pretrained=pretrained or None,
            precision="fp32",
            device=device,
            output_dict=True,
            force_image_size=image_size,
        )
    finally:
        logging.getLogger().setLevel(level)
    if not pretrained:
        initialise_caption_decoder(model)
    if grad_checkpointing:
        model.set_grad_checkpointing(True)
    dtype = torch.bfloat16 if precision == "pure_bf16" else torch.float32
    if dtype != torch.float32:
        model.to(dtype)
    context_length = int(getattr(model, "context_length", None) or context_length)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg.get("size", 224)
    image_size = size if isinstance(size, int) else int(size[0])
    mean = torch.tensor(cfg.get("mean", open_clip.OPENAI_DATASET_MEAN), device=device).view(1, 3, 1, 1)
    std = torch.tensor(cfg.get("std", open_clip.OPENAI_DATASET_STD), device=device).view(1, 3, 1, 1)
    return ModelBundle(model, tokenize, image_size, mean, std, context_length, dtype)


def no_weight_decay(
    name: str,
    param: torch.nn.Parameter,
    model_exclusions: frozenset[str] = frozenset(),
    patterns: Sequence[str] = (),
) -> bool:
    """Gains (norm weights), biases and the logit scale/bias are not decayed: shrinking them
    toward 0 changes what the network computes rather than regularising it. They are the tensors
    with fewer than 2 dimensions and the logit parameters by name; then the embeddings the model
    itself names (open_clip's ``no_weight_decay()``: positional and class embeddings, which are
    positions and a token, not weights to regularise), and the user's fnmatch ``patterns``."""
    if param.ndim < 2 or "logit_scale" in name or "logit_bias" in name:
        return True
    return name in model_exclusions or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def model_no_weight_decay(model: torch.nn.Module) -> frozenset[str]:
    """The parameter names the model excludes from weight decay (``no_weight_decay()``)."""
    names = getattr(model, "no_weight_decay", None)
    return frozenset(names()) if callable(names) else frozenset()


def param_groups(
    model: torch.nn.Module, weight_decay: float, patterns: Sequence[str] = ()
) -> list[dict[str, object]]:
    decay, no_decay = [], []
    exclusions = model_no_weight_decay(model)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if no_weight_decay(name, param, exclusions, patterns) else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


PRECISIONS = ("bf16", "fp16", "fp32", "pure_bf16")


def lock_towers(model: torch.nn.Module, cfg: ModelConfig) -> None:
    """LiT-style locked towers (open_clip's ``lock_image_tower`` / ``lock_text_tower``): the
    frozen parameters get no gradient, so the optimizer and DDP leave them exactly as they are."""
    if cfg.lock_image:
        model.lock_image_tower(
            unlocked_groups=cfg.lock_image_unlocked_groups, freeze_bn_stats=cfg.lock_image_freeze_bn_stats
        )
    if cfg.lock_text:
        model.lock_text_tower(
            unlocked_layers=cfg.lock_text_unlocked_layers, freeze_layer_norm=cfg.lock_text_freeze_layer_norm
        )


def autocast_factory(precision: str, device: torch.device) -> Callable[[], AbstractContextManager[object]]:
    """A context factory: bf16 or fp16 autocast on the device's type, or nothing for fp32."""
    if precision in ("fp32", "pure_bf16"):  # pure_bf16: the weights themselves are bfloat16
        return nullcontext
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return lambda: torch.autocast(device_type=device.type, dtype=dtype)
    raise ValueError(f"model.precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's dynamic loss scaling (torch.amp.GradScaler: the loss is multiplied by a scale that
    halves on every step whose gradients overflow, which is then skipped, and doubles after 2000
    clean steps); None for bf16 and fp32, whose exponent range needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The open_clip model inside a torch.compile and a DistributedDataParallel wrapper."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
