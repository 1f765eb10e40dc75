"""Learning rate: scaled from a base rate by the global batch size, then warmup + cosine decay
(or constant, or constant with a final cooldown)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LrScaling:
    """How the peak learning rate was derived (printed at the start of training)."""

    base_lr: float
    base_batch: int
    global_batch: int
    rule: str
    lr: float

    def describe(self) -> str:
        ratio = self.global_batch / self.base_batch
        factor = self.lr / self.base_lr
        how = {"sqrt": f"sqrt({ratio:g})", "linear": f"{ratio:g}", "none": "1 (scaling off)"}[self.rule]
        return (
            f"lr {self.lr:.4g} = base_lr {self.base_lr:g} x {how} = x{factor:.4g} "
            f"(global batch {self.global_batch} vs base batch {self.base_batch}, {self.rule} rule)"
        )


def resolve_rule(rule: str, optimizer: str) -> str:
    """'auto' picks the rule that keeps the update size steady for the optimizer: AdamW's step is
    normalised per coordinate, so its noise scales with sqrt(batch); plain SGD scales linearly."""
    if rule != "auto":
        return rule
    return "sqrt" if optimizer == "adamw" else "linear"


def global_batch_size(per_device: int, world_size: int, accum_steps: int) -> int:
    return per_device * world_size * accum_steps


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> LrScaling:
    ratio = global_batch / base_batch
    if rule == "sqrt":
        factor = math.sqrt(ratio)
    elif rule == "linear":
        factor = ratio
    elif rule == "none":
        factor = 1.0
    else:
        raise ValueError(f"unknown lr scaling rule {rule!r} (sqrt, linear, none)")
    return LrScaling(base_lr, base_batch, global_batch, rule, base_lr * factor)


def lr_factor(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int,
    schedule: str,
    min_ratio: float,
    cooldown_steps: int = 0,
    cooldown_power: float = 1.0,
) -> float:
    """Multiplier of the peak rate for the update made at ``step`` (0-based): linear warmup over
    the first ``warmup_steps`` updates (never 0, so the first step moves), then cosine from 1 down to
    ``min_ratio`` at the last step; or constant; or const-cooldown: constant until the last
    ``cooldown_steps`` steps, then ``(1 - progress) ** cooldown_power`` down to ``min_ratio`` (the
    shape of open_clip's ``const_lr_cooldown``)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "const-cooldown":
        start = total_steps - cooldown_steps
        if step < start:
            return 1.0
        progress = min(1.0, (step - start) / max(1, cooldown_steps))
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress) ** cooldown_power
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """Sets the learning rate of every parameter group before each optimizer step. Its state is
    just the step counter, so a checkpoint restores it exactly."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        peak_lr: float,
        total_steps: int,
        warmup_steps: int,
        schedule: str = "cosine",
        min_ratio: float = 0.0,
        cooldown_steps: int = 0,
        cooldown_power: float = 1.0,
    ) -> None:
        self.optimizer = optimizer
        self.peak_lr = peak_lr
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.min_ratio = min_ratio
        self.cooldown_steps = cooldown_steps
        self.cooldown_power = cooldown_power
        self.step_count = 0
        self.apply()

    def lr_at(self, step: int) -> float:
        return self.peak_lr * lr_factor(
            step,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            schedule=self.schedule,
            min_ratio=self.min_ratio,
            cooldown_steps=self.cooldown_steps,
            cooldown_power=self.cooldown_power,
        )

    @property
    def lr(self) -> float:
        return self.lr_at(self.step_count)

    def apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def step(self) -> None:
        """Advance after an optimizer step and set the rate of the next one."""
        self.step_count += 1
        self.apply()

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_count": self.step_count,
            "peak_lr": self.peak_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "schedule": self.schedule,
            "min_ratio": self.min_ratio,
            "cooldown_steps": self.cooldown_steps,
            "cooldown_power": self.cooldown_power,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the position. The shape of the schedule comes from the current config, so a
        resumed run that changed it (e.g. more steps) follows the new schedule from here on."""
        self.step_count = int(state["step_count"])
        self.apply()
