"""The training losses of image-text models across ranks (CLIP, SigLIP, CoCa), and gradient
accumulation that is exact for each of them.

A contrastive loss couples every sample with every other one in the batch (they are each other's
negatives), so averaging the losses of k small batches is *not* the loss of one batch k times as
large. ``contrastive_backward`` instead follows open_clip's ``accum_freq`` scheme:

1. compute the features of all k micro-batches without a graph (cheap on memory);
2. for each micro-batch j, recompute its features with a graph and back-propagate the loss of the
   whole k*m batch, in which micro-batch j is live and the others are the cached constants.

The loss is the same function of the features in every pass, so the k backward passes add up to
exactly the gradient of one big batch: pass j contributes dL/df_j * df_j/dtheta. One detail makes
it exact for the temperature and SigLIP's bias as well: the logit scale and the logit bias are live
in one pass only (the last), so their gradients are counted once, not k times.

CoCa adds a captioning term, a cross-entropy over each sample's own tokens: it couples nothing, so
pass j back-propagates micro-batch j's share of it only, as a sum over its tokens divided by the
token count of the whole batch (what the big batch's mean over tokens is). The count is that of the
global batch (one all-reduce of an integer per step), so the caption loss is the mean over every
token of every rank, as one process on the global batch computes it, rather than a mean of the
ranks' means (open_clip's), which weighs a rank's tokens more when its captions are shorter.

Across ranks (each rank computes the loss of its own rows; DistributedDataParallel averages):

- CLIP: open_clip's ``ClipLoss``, features all-gathered with their gradients, ``local_loss``;
- SigLIP: open_clip's ``SigLipLoss``, the sigmoid loss of this rank's images against every rank's
  texts. ``model.siglip_exchange: neighbour`` (default, open_clip's ``bidir``) passes text features
  around the ring, both ways at once, W-1 exchanges, holding one neighbour's block at a time;
  ``gather`` all-gathers them once (one collective, W blocks held). Both give the same loss and
  gradient; the ring is what scales to many ranks;
- CoCa: ``ClipLoss`` as above times its weight, plus the caption loss times its weight (open_clip's
  ``CoCaLoss`` with the defaults of open_clip_train: 1 and 2).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from shardstream.train.config import ConfigError

# open_clip 3.3 gathers with torch.distributed.nn.all_gather, which torch 2.15 marks deprecated
# (still correct, and the documented way to gather with gradients): not the user's concern.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated", category=FutureWarning
)

LossKind = Literal["clip", "siglip", "coca"]
LOSS_KINDS: tuple[LossKind, ...] = ("clip", "siglip", "coca")
SIGLIP_EXCHANGES = {"neighbour": "bidir", "gather": "gather"}  # ours -> open_clip's dist_impl


def is_coca(model: torch.nn.Module) -> bool:
    from open_clip import CoCa

    return isinstance(model, CoCa)


def has_logit_bias(model: torch.nn.Module) -> bool:
    return getattr(model, "logit_bias", None) is not None


def resolve_loss_kind(requested: str, model: torch.nn.Module, model_name: str) -> LossKind:
    """The loss a model trains with: ``auto`` reads it from the model (a CoCa model: coca; a logit
    bias, what ``init_logit_bias`` in an open_clip config creates: siglip; else clip). An explicit
    choice that would leave parameters without a gradient (DDP stops on them at the second step)
    or that the model cannot compute is refused, in one line naming both."""
    coca, bias = is_coca(model), has_logit_bias(model)
    if requested == "auto":
        return "coca" if coca else "siglip" if bias else "clip"
    if requested not in LOSS_KINDS:
        raise ConfigError(f"model.loss: expected auto or one of {', '.join(LOSS_KINDS)}, got {requested!r}")
    if requested == "coca" and not coca:
        raise ConfigError(f"model.loss: coca needs a CoCa model (coca_*), and {model_name} is not one")
    if coca and requested != "coca":
        raise ConfigError(
            f"model.loss: {requested} on the CoCa model {model_name} leaves its caption decoder "
            "untrained; use coca or auto"
        )
    if requested == "siglip" and not bias:
        raise ConfigError(
            f"model.loss: siglip needs a model with a logit bias (init_logit_bias in its config), "
            f"and {model_name} has none; use clip or auto"
        )
    if requested == "clip" and bias:
        raise ConfigError(
            f"model.loss: clip on {model_name} leaves its logit_bias untrained (a SigLIP model); "
            "use siglip or auto"
        )
    return requested  # type: ignore[return-value]


@dataclass
class TrainLoss:
    """What the trainer minimises: a term coupling the whole (accumulated) batch across ranks,
    plus, for CoCa, a per-sample caption term."""

    kind: LossKind
    contrastive: torch.nn.Module  # open_clip's ClipLoss or SigLipLoss
    contrastive_weight: float = 1.0
    caption_weight: float = 0.0
    pad_id: int = 0  # open_clip's tokenizers pad with 0; CoCa's caption loss ignores it
    world_size: int = 1

    def coupled(
        self, image_features: Tensor, text_features: Tensor, logit_scale: Tensor, logit_bias: Tensor | None
    ) -> Tensor:
        if self.kind == "siglip":
            return self.contrastive(image_features, text_features, logit_scale, logit_bias)
        return self.contrastive_weight * self.contrastive(image_features, text_features, logit_scale)

    def caption_tokens(self, labels: Tensor) -> Tensor:
        """The number of tokens the caption loss is averaged over (labels that are not padding;
        CoCa's labels are the tokens after the first)."""
        return (labels != self.pad_id).sum()

    def global_tokens(self, local: Tensor) -> Tensor:
        """The caption token count of the whole global batch (a collective: every rank calls it)."""
        if self.world_size == 1:
            return local
        total = local.detach().clone()
        torch.distributed.all_reduce(total)
        return total

    def caption(self, logits: Tensor, labels: Tensor, global_count: Tensor) -> Tensor:
        """This micro-batch's share of the global batch's mean caption cross-entropy, as this
        rank's loss: DistributedDataParallel averages the ranks' gradients, hence the world size."""
        summed = F.cross_entropy(logits.permute(0, 2, 1), labels, ignore_index=self.pad_id, reduction="sum")
        return self.caption_weight * self.world_size * summed / global_count.clamp(min=1)

    def rank_local(self) -> TrainLoss:
        """A copy computing one rank's batch alone (no gathering, no collective): what held-out
        evaluation needs, where the ranks' shares differ in size and a collective would hang."""
        contrastive = copy.deepcopy(self.contrastive)  # nothing the copy caches is the trainer's
        contrastive.rank, contrastive.world_size = 0, 1
        if isinstance(getattr(contrastive, "labels", None), dict):
            contrastive.labels = {}  # ClipLoss caches labels offset by its rank
        return dataclasses.replace(self, contrastive=contrastive, world_size=1)

    def __call__(self, out: dict[str, Tensor]) -> Tensor:
        """The loss of one model output (a batch on its own, no accumulation)."""
        loss = self.coupled(
            out["image_features"], out["text_features"], out["logit_scale"], out.get("logit_bias")
        )
        if self.kind == "coca":
            count = self.global_tokens(self.caption_tokens(out["labels"]))
            loss = loss + self.caption(out["logits"], out["labels"], count)
        return loss


def make_loss(
    kind: LossKind,
    rank: int,
    world_size: int,
    *,
    siglip_exchange: str = "neighbour",
    coca_contrastive_weight: float = 1.0,
    coca_caption_weight: float = 2.0,
) -> TrainLoss:
    from open_clip.loss import SigLipLoss

    if kind == "siglip":
        if siglip_exchange not in SIGLIP_EXCHANGES:
            raise ConfigError(
                f"model.siglip_exchange: expected one of {', '.join(SIGLIP_EXCHANGES)}, "
                f"got {siglip_exchange!r}"
            )
        impl = SIGLIP_EXCHANGES[siglip_exchange]
        return TrainLoss(
            kind, SigLipLoss(rank=rank, world_size=world_size, dist_impl=impl), world_size=world_size
        )
    return TrainLoss(
        kind,
        make_clip_loss(rank, world_size),
        contrastive_weight=coca_contrastive_weight if kind == "coca" else 1.0,
        caption_weight=coca_caption_weight if kind == "coca" else 0.0,
        world_size=world_size,
    )


def make_clip_loss(rank: int, world_size: int) -> torch.nn.Module:
    """open_clip's ClipLoss with features gathered across ranks with their gradients, each rank
    computing the loss of its own rows against all columns (local_loss): the same gradient as
    the full global loss, at 1/W of the logits memory."""
    from open_clip import ClipLoss

    return ClipLoss(
        local_loss=True, gather_with_grad=True, cache_labels=True, rank=rank, world_size=world_size
    )


def _no_sync(model: torch.nn.Module) -> Callable[[], AbstractContextManager[object]]:
    """The context that keeps a pass's gradients local: DDP's ``no_sync``, FSDP2's switch."""
    from shardstream.train.fsdp import is_fsdp, no_gradient_sync

    if is_fsdp(model):
        return lambda: no_gradient_sync(model)
    return getattr(model, "no_sync", nullcontext)


def contrastive_backward(
    model: torch.nn.Module,
    loss_fn: TrainLoss,
    micro_batches: Sequence[tuple[Tensor, Tensor]],
    *,
    autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
    scale: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Back-propagates the loss of the concatenation of ``micro_batches`` (each a pair of
    normalised images and tokens) into ``.grad``; returns the loss (detached, unscaled).

    ``scale``: fp16's loss scaling (``GradScaler.scale``), applied to the loss of every pass. The
    scale does not change within a step, so the passes still add up to the big batch's gradient,
    times the scale, which ``GradScaler.unscale_`` divides out once.

    With DistributedDataParallel, gradients are all-reduced once, on the last pass (``no_sync``
    for the others); with FSDP2 they are reduce-scattered once, likewise."""

    def backward(loss: Tensor) -> None:
        (scale(loss) if scale is not None else loss).backward()

    if not micro_batches:
        raise ValueError("contrastive_backward needs at least one micro-batch")
    if len(micro_batches) == 1:
        images, tokens = micro_batches[0]
        with autocast():
            loss = loss_fn(model(images, tokens))
        backward(loss)
        return loss.detach()

    with torch.no_grad(), autocast():
        cached = []
        for images, tokens in micro_batches:
            out = model(images, tokens)
            cached.append((out["image_features"], out["text_features"]))
    captions = loss_fn.kind == "coca"
    token_count = None
    if captions:
        local = sum(loss_fn.caption_tokens(tokens[:, 1:]) for _, tokens in micro_batches)
        token_count = loss_fn.global_tokens(local)  # type: ignore[arg-type]
    no_sync = _no_sync(model)
    last = len(micro_batches) - 1
    coupled = torch.zeros(())
    caption_total: Tensor | None = None  # stays on the device: nothing here reads a value
    for j, (images, tokens) in enumerate(micro_batches):
        with nullcontext() if j == last else no_sync():
            with autocast():
                out = model(images, tokens)
                logit_scale, logit_bias = out["logit_scale"], out.get("logit_bias")
                if j != last:
                    logit_scale = logit_scale.detach()
                    logit_bias = logit_bias.detach() if logit_bias is not None else None
                image_features = torch.cat(
                    [out["image_features"] if i == j else c[0] for i, c in enumerate(cached)]
                )
                text_features = torch.cat(
                    [out["text_features"] if i == j else c[1] for i, c in enumerate(cached)]
                )
                coupled = loss_fn.coupled(image_features, text_features, logit_scale, logit_bias)
                loss = coupled
                if captions:
                    assert token_count is not None
                    caption = loss_fn.caption(out["logits"], out["labels"], token_count)
                    caption_total = (
                        caption.detach() if caption_total is None else caption_total + caption.detach()
                    )
                    loss = loss + caption
            backward(loss)
    return coupled.detach() if caption_total is None else coupled.detach() + caption_total
