"""The losses CLIP teams train with, chosen from the model (``model.loss: auto``): CLIP, SigLIP
(sigmoid loss with a logit bias, across ranks) and CoCa (contrastive + caption).

- ``auto`` reads the loss from the model, and a choice that would leave parameters without a
  gradient (what stopped DDP at the second step on a SigLIP model) is refused in one line;
- accumulation is exact for each: k micro-batches give the gradient of one big batch (max abs
  difference < 1e-5 in fp32), with the logit scale and bias counted once;
- under a real torchrun (2 ranks, gloo), the SigLIP loss across ranks (both exchanges) and CoCa's
  give one process's gradient of the global batch, with and without accumulation;
- train_clip.py trains the tiny SigLIP and CoCa models on 2 ranks: the logit bias moves, and the
  caption decoder's parameters change."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from accum_gradients import gradients, max_abs, model_batch, relative_error, split
from shardstream.train.config import ConfigError
from shardstream.train.loss import make_loss, resolve_loss_kind
from shardstream.train.model import create_model
from train_support import build_small_dataset, read_log, small_config_args, torchrun

SIGLIP_MODEL = "shardstream-tiny-sigmoid"  # a config with init_logit_bias and the CLIP tokenizer
COCA_MODEL = "shardstream-tiny-coca"
ABSOLUTE = 1e-5  # max |g_accum - g_full| over every parameter, fp32
RELATIVE = 1e-4  # per tensor, relative to its largest gradient (tests/test_train_accum.py)


@pytest.mark.parametrize(
    ("name", "kind"), [("shardstream-tiny", "clip"), (SIGLIP_MODEL, "siglip"), (COCA_MODEL, "coca")]
)
def test_auto_reads_the_loss_from_the_model(name: str, kind: str) -> None:
    bundle = create_model(name, pretrained="", device=torch.device("cpu"))
    assert resolve_loss_kind("auto", bundle.model, name) == kind
    assert resolve_loss_kind(kind, bundle.model, name) == kind


@pytest.mark.parametrize(
    ("name", "requested", "says"),
    [
        (SIGLIP_MODEL, "clip", "leaves its logit_bias untrained"),
        (COCA_MODEL, "clip", "leaves its caption decoder untrained"),
        (COCA_MODEL, "siglip", "leaves its caption decoder untrained"),
        ("shardstream-tiny", "siglip", "needs a model with a logit bias"),
        ("shardstream-tiny", "coca", "needs a CoCa model"),
    ],
)
def test_a_loss_the_model_cannot_train_is_refused_in_one_line(name: str, requested: str, says: str) -> None:
    bundle = create_model(name, pretrained="", device=torch.device("cpu"))
    with pytest.raises(ConfigError) as raised:
        resolve_loss_kind(requested, bundle.model, name)
    message = str(raised.value)
    assert message.startswith(f"model.loss: {requested}") and name in message and says in message
    assert "\n" not in message


@pytest.mark.parametrize("name", [SIGLIP_MODEL, COCA_MODEL])
@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_gives_the_gradient_of_one_big_batch(name: str, k: int) -> None:
    bundle, x, t = model_batch(name)
    loss_fn = make_loss(resolve_loss_kind("auto", bundle.model, name), 0, 1)
    full_loss, full = gradients(bundle.model, loss_fn, [(x, t)])
    accum_loss, accum = gradients(bundle.model, loss_fn, split(x, t, k))
    assert accum_loss == pytest.approx(full_loss, rel=1e-5)
    assert max_abs(accum, full) < ABSOLUTE
    assert relative_error(accum, full) <= RELATIVE
    # the temperature's (and SigLIP's bias') gradient is counted once, not k times
    assert float(accum["logit_scale"]) == pytest.approx(float(full["logit_scale"]), rel=1e-4, abs=1e-7)
    if name == SIGLIP_MODEL:
        assert abs(float(full["logit_bias"])) > 1e-3  # live: the bias gets a real gradient
        assert float(accum["logit_bias"]) == pytest.approx(float(full["logit_bias"]), rel=1e-4)


def test_the_siglip_check_has_teeth() -> None:
    """Averaging the losses of small batches (each its own negatives) is far from the big batch."""
    bundle, x, t = model_batch(SIGLIP_MODEL)
    loss_fn = make_loss("siglip", 0, 1)
    _, full = gradients(bundle.model, loss_fn, [(x, t)])
    bundle.model.zero_grad(set_to_none=True)
    for xi, ti in split(x, t, 4):
        (loss_fn(bundle.model(xi, ti)) / 4).backward()
    naive = {n: p.grad.clone() for n, p in bundle.model.named_parameters() if p.requires_grad}
    assert relative_error(naive, full) > 100 * RELATIVE


def test_the_caption_term_is_averaged_over_the_whole_batchs_tokens() -> None:
    """CoCa's caption loss is a mean over every non-padding token of the batch: micro-batches with
    captions of different lengths must be weighted by their token counts, not equally."""
    bundle, x, t = model_batch(COCA_MODEL)
    loss_fn = make_loss("coca", 0, 1)
    counts = [int(loss_fn.caption_tokens(ti[:, 1:])) for _, ti in split(x, t, 4)]
    assert len(set(counts)) > 1  # the check is only meaningful for unequal counts
    out = bundle.model(x, t)
    expected = torch.nn.functional.cross_entropy(
        out["logits"].permute(0, 2, 1), out["labels"], ignore_index=0
    )
    total = loss_fn.caption(out["logits"], out["labels"], loss_fn.caption_tokens(out["labels"]))
    assert float(total.detach()) == pytest.approx(
        2.0 * float(expected.detach()), rel=1e-5
    )  # open_clip's CoCaLoss weight


def test_a_coca_model_from_scratch_never_starts_from_uninitialised_memory() -> None:
    """open_clip 3.3 leaves CoCa's ``text_decoder.text_projection`` as ``torch.empty``: after other
    tensors were freed it held 1e30 (a loss of 5.7e12 on the first batch). Found by this file's
    accumulation test, which passed alone and failed after the tests before it."""
    states = []
    for _ in range(2):
        garbage = [torch.full((1 << 20,), 1e30) for _ in range(64)]
        del garbage  # the allocator hands these pages out again
        torch.manual_seed(0)
        model = create_model(COCA_MODEL, pretrained="", device=torch.device("cpu")).model
        states.append({n: t.clone() for n, t in model.state_dict().items()})
    projection = states[0]["text_decoder.text_projection"]
    assert torch.isfinite(projection).all()
    assert float(projection.std()) == pytest.approx(128**-0.5, rel=0.05)  # its init_parameters' normal
    assert all(torch.equal(states[0][n], states[1][n]) for n in states[0])  # the seed decides, not memory


WORKER = textwrap.dedent(
    """
    import json
    import sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from accum_gradients import gradients, max_abs, model_batch, relative_error, split
    from test_train_losses import max_abs, model_batch
    from shardstream.train.loss import make_loss

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {{}}
    for name, kind, exchanges in {cases!r}:
        bundle, x, t = model_batch(name, 16)
        ddp = torch.nn.parallel.DistributedDataParallel(bundle.model, forward_sync_buffers=False)
        local_x, local_t = x[rank * 8 : (rank + 1) * 8], t[rank * 8 : (rank + 1) * 8]
        # reference: the whole global batch of 16 in one process, no DDP
        _, reference = gradients(bundle.model, make_loss(kind, 0, 1), [(x, t)])
        for exchange in exchanges:
            loss_fn = make_loss(kind, rank, world, siglip_exchange=exchange)
            for k in (1, 2, 4):
                _, grads = gradients(ddp, loss_fn, split(local_x, local_t, k))
                errors = [max_abs(grads, reference), relative_error(grads, reference)]
                results[f"{{kind}}/{{exchange}}/{{k}}"] = errors
    with open({out!r} + f"/rank{{rank}}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_ranks_give_one_process_gradient_of_the_global_batch(tmp_path: Path) -> None:
    cases = [(SIGLIP_MODEL, "siglip", ["neighbour", "gather"]), (COCA_MODEL, "coca", ["neighbour"])]
    script = tmp_path / "loss_worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent), out=str(tmp_path), cases=cases))
    run = torchrun([], nproc=2, timeout=300, script=str(script))
    assert run.returncode == 0, run.stdout + run.stderr
    results = {
        (rank, key): value
        for rank in (0, 1)
        for key, value in json.loads((tmp_path / f"rank{rank}.json").read_text()).items()
    }
    expected = {
        f"{kind}/{exchange}/{k}" for _, kind, exchanges in cases for exchange in exchanges for k in (1, 2, 4)
    }
    assert {key for _, key in results} == expected
    shown = "\n".join(
        f"rank {r} {key}: abs {a:.2e} rel {e:.2e}" for (r, key), (a, e) in sorted(results.items())
    )
    for absolute, relative in results.values():
        assert absolute < ABSOLUTE and relative <= RELATIVE, shown


def _checkpoint_model(output_dir: Path) -> dict[str, torch.Tensor]:
    from shardstream.train.checkpoint import load_checkpoint, resolve_checkpoint

    return load_checkpoint(resolve_checkpoint("latest", output_dir / "checkpoints"))["model"]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return build_small_dataset(tmp_path_factory.mktemp("loss-data"))


@pytest.mark.slow
def test_a_siglip_model_trains_on_two_ranks_and_its_bias_moves(small_data, tmp_path: Path) -> None:
    """The crash this fixes: DDP stopped at the second step ("parameters that were not used in
    producing loss") because the SigLIP model's logit_bias got no gradient from ClipLoss."""
    out = tmp_path / "run"
    args = small_config_args(
        small_data, out, "--model.name", SIGLIP_MODEL, "--train.max_steps", "4", "--train.accum_steps", "2",
        "--log.every_steps", "1", "--eval.at_end", "false", "--optim.base_lr", "1e-2",
    )  # fmt: skip
    run = torchrun(args, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "siglip loss" in run.stdout
    steps = [r for r in read_log(out) if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in steps)
    bias = float(_checkpoint_model(out)["logit_bias"])
    assert bias != -10.0 and steps[-1]["logit_bias"] == pytest.approx(bias, rel=1e-6)


@pytest.mark.slow
def test_a_coca_model_trains_on_two_ranks_and_its_decoder_learns(small_data, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = small_config_args(
        small_data, out, "--model.name", COCA_MODEL, "--train.max_steps", "2",
        "--log.every_steps", "1", "--eval.at_end", "false",
    )  # fmt: skip
    run = torchrun(args, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "coca loss" in run.stdout
    trained = _checkpoint_model(out)
    torch.manual_seed(0)  # train.seed: the trainer's initialisation
    initial = create_model(COCA_MODEL, pretrained="", device=torch.device("cpu")).model.state_dict()
    decoder = [n for n in initial if n.startswith("text_decoder.") and initial[n].is_floating_point()]
    assert decoder
    changed = [n for n in decoder if not torch.equal(trained[n], initial[n])]
    # every decoder tensor that can get a gradient moved (buffers such as the attention mask stay)
    learnable = {
        n
        for n, p in create_model(
            COCA_MODEL, pretrained="", device=torch.device("cpu")
        ).model.named_parameters()
    }
    assert set(changed) == {n for n in decoder if n in learnable}
