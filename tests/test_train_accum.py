"""Gradient accumulation is exact for the contrastive loss: k micro-batches of m samples give the
gradient of one batch of k*m (every sample a negative for every other), in one process and across
two DDP ranks under a real torchrun.

Tolerance (fp32): for every parameter tensor, max |g_accum - g_full| <= 1e-4 * max |g_full|
(measured: about 5e-6; the gap is float summation order, not a missing term: averaging k
separate small-batch losses instead is off by far more, as the last test shows)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from shardstream.train.loss import contrastive_backward, make_clip_loss
from shardstream.train.model import create_model
from test_train_support import torchrun

TOLERANCE = 1e-4


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max() / (b[n].abs().max() + 1e-12)) for n in b)


def setup(n: int = 16):
    torch.manual_seed(0)
    bundle = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=generator)
    colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle", "star"]
    captions = [f"a {colours[i % 4]} {shapes[(i // 4) % 4]} number {i}" for i in range(n)]
    return bundle, bundle.normalise(images, torch.device("cpu")), bundle.tokenizer(captions)


def gradients(model: torch.nn.Module, loss_fn, micro) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = contrastive_backward(model, loss_fn, micro)
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


def split(x: torch.Tensor, t: torch.Tensor, k: int):
    m = x.shape[0] // k
    return [(x[i * m : (i + 1) * m], t[i * m : (i + 1) * m]) for i in range(k)]


@pytest.mark.parametrize("k", [2, 4, 8])
def test_k_micro_batches_give_the_gradient_of_one_big_batch(k: int) -> None:
    bundle, x, t = setup()
    loss_fn = make_clip_loss(0, 1)
    full_loss, full = gradients(bundle.model, loss_fn, [(x, t)])
    accum_loss, accum = gradients(bundle.model, loss_fn, split(x, t, k))
    assert accum_loss == pytest.approx(full_loss, rel=1e-5)
    assert relative_error(accum, full) <= TOLERANCE
    # the temperature's gradient is counted once, not k times
    assert float(accum["logit_scale"]) == pytest.approx(float(full["logit_scale"]), rel=1e-4)


def test_averaging_small_batch_losses_would_not_be_exact() -> None:
    """The check above has teeth: the naive alternative differs far beyond the tolerance."""
    bundle, x, t = setup()
    loss_fn = make_clip_loss(0, 1)
    _, full = gradients(bundle.model, loss_fn, [(x, t)])
    bundle.model.zero_grad(set_to_none=True)
    for xi, ti in split(x, t, 4):
        out = bundle.model(xi, ti)
        (loss_fn(out["image_features"], out["text_features"], out["logit_scale"]) / 4).backward()
    naive = {n: p.grad.clone() for n, p in bundle.model.named_parameters()}
    assert relative_error(naive, full) > 100 * TOLERANCE


WORKER = textwrap.dedent(
    """
    import json
    import sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_train_accum import gradients, relative_error, setup, split
    from shardstream.train.loss import make_clip_loss

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    bundle, x, t = setup(16)
    # reference: the whole global batch of 16 in one process, no DDP
    _, reference = gradients(bundle.model, make_clip_loss(0, 1), [(x, t)])
    ddp = torch.nn.parallel.DistributedDataParallel(bundle.model, forward_sync_buffers=False)
    local_x, local_t = x[rank * 8 : (rank + 1) * 8], t[rank * 8 : (rank + 1) * 8]
    loss_fn = make_clip_loss(rank, world)
    errors = {{}}
    for k in (1, 2, 4):
        bundle.model.zero_grad(set_to_none=True)
        from shardstream.train.loss import contrastive_backward
        contrastive_backward(ddp, loss_fn, split(local_x, local_t, k))
        grads = {{n: p.grad.clone() for n, p in bundle.model.named_parameters()}}
        errors[k] = relative_error(grads, reference)
    # one file per rank: two ranks printing to one pipe can interleave mid-line
    with open({out!r} + f"/rank{{rank}}.json", "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_ranks_with_accumulation_match_one_process_on_the_global_batch(tmp_path: Path) -> None:
    script = tmp_path / "accum_worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    run = torchrun([], nproc=2, timeout=180, script=str(script))
    assert run.returncode == 0, run.stdout + run.stderr
    errors = {
        (rank, int(k)): float(e)
        for rank in (0, 1)
        for k, e in json.loads((tmp_path / f"rank{rank}.json").read_text()).items()
    }
    assert set(errors) == {(r, k) for r in (0, 1) for k in (1, 2, 4)}, errors
    assert max(errors.values()) <= TOLERANCE, errors
