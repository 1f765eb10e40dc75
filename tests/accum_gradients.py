"""The gradients that the accumulation tests compare: the tiny models on a fixed batch, their
gradient as the trainer accumulates it over micro-batches, and the distance between two
gradients. Shared by the tests and the DDP worker script they start under torchrun."""

from __future__ import annotations

import torch
from shardstream.train.loss import contrastive_backward
from shardstream.train.model import autocast_factory, create_model, grad_scaler


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max() / (b[n].abs().max() + 1e-12)) for n in b)


def global_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    diff = sum(float((a[n] - b[n]).double().pow(2).sum()) for n in b)
    return (diff / sum(float(b[n].double().pow(2).sum()) for n in b)) ** 0.5


def max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in b)


def error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], precision: str) -> float:
    return relative_error(a, b) if precision == "fp32" else global_error(a, b)


def setup(n: int = 16):
    torch.manual_seed(0)
    bundle = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=generator)
    colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle", "star"]
    captions = [f"a {colours[i % 4]} {shapes[(i // 4) % 4]} number {i}" for i in range(n)]
    return bundle, bundle.normalise(images, torch.device("cpu")), bundle.tokenizer(captions)


def gradients(
    model: torch.nn.Module, loss_fn, micro, precision: str = "fp32"
) -> tuple[float, dict[str, torch.Tensor]]:
    """The accumulated gradient as the trainer makes it: autocast, and for fp16 a GradScaler
    whose scaled loss is back-propagated and unscaled once (``unscale_``, as before clipping)."""
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    scaler = grad_scaler(precision, device)
    loss = contrastive_backward(
        model,
        loss_fn,
        micro,
        autocast=autocast_factory(precision, device),
        scale=scaler.scale if scaler is not None else None,
    )
    if scaler is not None:
        assert scaler.get_scale() > 1  # the loss was really scaled
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.0))
    inner = getattr(model, "module", model)  # DistributedDataParallel's parameters are its module's
    return float(loss), {n: p.grad.clone() for n, p in inner.named_parameters() if p.requires_grad}


def split(x: torch.Tensor, t: torch.Tensor, k: int):
    m = x.shape[0] // k
    return [(x[i * m : (i + 1) * m], t[i * m : (i + 1) * m]) for i in range(k)]


def model_batch(name: str, n: int = 16):
    """A model of ``name`` (seeded) and a fixed batch for it, with captions of unequal lengths.

    A SigLIP model's bias is set to 0: at its initial -10 the positive pairs dominate the loss so
    much that the negatives, the only terms that couple samples, hardly reach the gradient, and
    a check of the coupling would have no teeth."""
    torch.manual_seed(0)
    bundle = create_model(name, pretrained="", device=torch.device("cpu"))
    if getattr(bundle.model, "logit_bias", None) is not None:
        with torch.no_grad():
            bundle.model.logit_bias.fill_(0.0)
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=generator)
    captions = [f"a photo of thing number {i} with {'many ' * (i % 5)}words" for i in range(n)]
    return bundle, bundle.normalise(images, torch.device("cpu")), bundle.tokenizer(captions)
