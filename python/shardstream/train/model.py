"""open_clip model, tokenizer, on-device image normalisation and the optimizer's parameter groups."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from shardstream.train.config import ConfigError

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

    def normalise(self, images: torch.Tensor, device: torch.device) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> normalised float32 on ``device``. Done on the device so that only
        uint8 crosses PCIe (a quarter of float32)."""
        x = images.to(device, non_blocking=True).float().div_(255.0)
        return x.sub_(self.mean).div_(self.std)


def create_model(
    name: str,
    *,
    pretrained: str,
    device: torch.device,
    grad_checkpointing: bool = False,
    image_size: int | None = None,
) -> ModelBundle:
    """An open_clip model in fp32 (autocast does the low-precision part), its tokenizer and its
    normalisation constants; ``image_size`` rebuilds it for another input size."""
    import open_clip

    register_model_configs()
    if name not in open_clip.list_models():
        raise ConfigError(
            f"model.name: unknown open_clip model {name!r}; known: shardstream-tiny, ViT-B-32, ... "
            "(open_clip.list_models())"
        )
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
    if grad_checkpointing:
        model.set_grad_checkpointing(True)
    tokenizer = open_clip.get_tokenizer(name)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg.get("size", 224)
    image_size = size if isinstance(size, int) else int(size[0])
    mean = torch.tensor(cfg.get("mean", open_clip.OPENAI_DATASET_MEAN), device=device).view(1, 3, 1, 1)
    std = torch.tensor(cfg.get("std", open_clip.OPENAI_DATASET_STD), device=device).view(1, 3, 1, 1)
    context_length = getattr(model, "context_length", None)
    return ModelBundle(
        model, tokenizer, image_size, mean, std, int(context_length) if context_length else None
    )


def no_weight_decay(name: str, param: torch.nn.Parameter) -> bool:
    """Gains (norm weights), biases and the logit scale/bias are not decayed: shrinking them
    toward 0 changes what the network computes rather than regularising it. They are exactly the
    tensors with fewer than 2 dimensions, plus the logit parameters by name."""
    return param.ndim < 2 or "logit_scale" in name or "logit_bias" in name


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, object]]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if no_weight_decay(name, param) else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


PRECISIONS = ("bf16", "fp16", "fp32")


def autocast_factory(precision: str, device: torch.device) -> Callable[[], AbstractContextManager[object]]:
    """A context factory: bf16 or fp16 autocast on the device's type, or nothing for fp32."""
    if precision == "fp32":
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
    """The open_clip model inside a DistributedDataParallel wrapper."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
