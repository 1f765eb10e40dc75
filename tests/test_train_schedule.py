"""Learning-rate scaling and schedule, and which parameters get weight decay."""

from __future__ import annotations

import math

import pytest
import torch
from shardstream.train.model import create_model, param_groups
from shardstream.train.schedule import WarmupCosine, global_batch_size, resolve_rule, scale_lr


def test_global_batch_counts_devices_and_accumulation() -> None:
    assert global_batch_size(64, 2, 1) == 128
    assert global_batch_size(32, 8, 4) == 1024


@pytest.mark.parametrize(
    ("rule", "global_batch", "expected"),
    [("sqrt", 512, 2e-3 * 2), ("linear", 512, 2e-3 * 4), ("none", 512, 2e-3), ("sqrt", 32, 2e-3 / 2)],
)
def test_lr_scaling_rules(rule: str, global_batch: int, expected: float) -> None:
    scaling = scale_lr(2e-3, 128, global_batch, rule)
    assert scaling.lr == pytest.approx(expected)
    assert f"{scaling.lr:.4g}" in scaling.describe()
    assert rule in scaling.describe()


def test_auto_rule_is_sqrt_for_adamw_and_linear_for_sgd() -> None:
    assert resolve_rule("auto", "adamw") == "sqrt"
    assert resolve_rule("auto", "sgd") == "linear"
    assert resolve_rule("linear", "adamw") == "linear"


def test_warmup_then_cosine_to_the_floor() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=123.0)
    sched = WarmupCosine(opt, peak_lr=1.0, total_steps=110, warmup_steps=10, min_ratio=0.1)
    lrs = []
    for _ in range(110):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs[0] == pytest.approx(0.1)  # never 0: the first step moves
    assert lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert sched.lr_at(110) == pytest.approx(0.1)

    # the state restores the position exactly
    other = WarmupCosine(opt, peak_lr=1.0, total_steps=110, warmup_steps=10, min_ratio=0.1)
    other.load_state_dict(sched.state_dict())
    assert other.lr == sched.lr and opt.param_groups[0]["lr"] == sched.lr


def test_weight_decay_skips_gains_biases_and_logit_scale() -> None:
    model = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu")).model
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "logit_scale" in skipped
    assert "ln_final.weight" in skipped and "ln_final.bias" in skipped
    assert any(n.endswith("attn.in_proj_bias") for n in skipped)
    assert all(p.ndim >= 2 for p in decay["params"])
    assert "visual.conv1.weight" in decayed and "text_projection" in decayed
    # every trained parameter is in one group; the fixed sin-cos position embedding is not trained
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert decayed | skipped == trained
    assert set(names.values()) - trained == {"visual.positional_embedding"}
