"""open_clip's recipe knobs in the trainer: weight-decay exclusions from the model's
``no_weight_decay()`` and patterns, the const-cooldown schedule (against open_clip_train's own),
locked towers (LiT), a random stream per rank, and ``srun`` without torchrun."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from servers import free_ports
from shardstream.train.model import create_model, param_groups
from shardstream.train.schedule import lr_factor
from train_support import ROOT, build_small_dataset, read_log, small_config_args, torchrun


def _decayed_names(model: torch.nn.Module, patterns: list[str] | None = None) -> set[str]:
    groups = param_groups(model, 0.1, patterns or [])
    ids = {id(p) for p in groups[0]["params"]}  # type: ignore[union-attr]
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_weight_decay_spares_the_embeddings_the_model_names() -> None:
    model = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu")).model
    decayed = _decayed_names(model)
    # 2-D tensors that are positions, not weights (open_clip's no_weight_decay()); decayed before
    assert "positional_embedding" not in decayed and "visual.positional_embedding" not in decayed
    assert "token_embedding.weight" in decayed and "visual.transformer.resblocks.0.mlp.c_fc.weight" in decayed
    with_pattern = _decayed_names(model, ["*.attn.in_proj_weight"])
    assert not any(n.endswith(".attn.in_proj_weight") for n in with_pattern)
    assert with_pattern == {n for n in decayed if not n.endswith(".attn.in_proj_weight")}


def test_const_cooldown_follows_open_clip_train() -> None:
    from open_clip_train.scheduler import const_lr_cooldown

    total, warmup, cooldown, peak = 100, 10, 30, 0.5
    for power, floor in ((1.0, 0.0), (2.0, 0.1)):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
        theirs = const_lr_cooldown(optimizer, peak, warmup, total, cooldown, power, floor * peak)
        for step in range(total):
            expected = theirs(step)
            ours = peak * lr_factor(
                step,
                total_steps=total,
                warmup_steps=warmup,
                schedule="const-cooldown",
                min_ratio=floor,
                cooldown_steps=cooldown,
                cooldown_power=power,
            )
            assert ours == pytest.approx(expected, rel=1e-12, abs=1e-15), (step, power)


RANK_STREAM_CALLBACK = '''
import json, os, torch
from shardstream.train import Callback

class RankStreams(Callback):
    """Records, per rank, the first draw of the torch stream and a digest of the initial weights."""

    def on_train_start(self, trainer):
        weights = sum(float(p.double().sum()) for p in trainer.bundle.model.parameters())
        with open(os.path.join(trainer.output_dir, f"streams-{trainer.ctx.rank}.json"), "w") as f:
            json.dump({"draw": torch.rand(4).tolist(), "weights": weights}, f)
'''


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return build_small_dataset(tmp_path_factory.mktemp("recipe-data"))


def _checkpoint_model(output_dir: Path) -> dict[str, torch.Tensor]:
    from shardstream.train.checkpoint import load_checkpoint, resolve_checkpoint

    return load_checkpoint(resolve_checkpoint("latest", output_dir / "checkpoints"))["model"]


@pytest.mark.slow
def test_a_locked_image_tower_stays_bit_identical_and_ranks_draw_their_own_numbers(
    small_data, tmp_path: Path
) -> None:
    (tmp_path / "cb").mkdir()
    (tmp_path / "cb" / "rank_streams_cb.py").write_text(RANK_STREAM_CALLBACK)
    out = tmp_path / "run"
    args = small_config_args(
        small_data, out, "--model.lock_image", "true", "--train.max_steps", "3", "--eval.at_end", "false",
        "--optim.base_lr", "1e-2", "--train.callbacks", "[rank_streams_cb:RankStreams]",
    )  # fmt: skip
    run = torchrun(args, timeout=300, extra_path=str(tmp_path / "cb"))
    assert run.returncode == 0, run.stdout + run.stderr
    trained = _checkpoint_model(out)
    torch.manual_seed(0)  # train.seed: the initialisation
    initial = create_model("shardstream-tiny", pretrained="", device=torch.device("cpu")).model.state_dict()
    visual = [n for n in initial if n.startswith("visual.")]
    assert visual and all(torch.equal(trained[n], initial[n]) for n in visual)
    assert not torch.equal(trained["token_embedding.weight"], initial["token_embedding.weight"])

    import json

    streams = [json.loads((out / f"streams-{r}.json").read_text()) for r in (0, 1)]
    assert streams[0]["weights"] == streams[1]["weights"]  # one initialisation
    assert streams[0]["draw"] != streams[1]["draw"]  # but dropout masks of their own


def _slurm_env(rank: int, world: int, port: int | None) -> dict[str, str]:
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NTASKS": str(world),
        "SLURM_TASKS_PER_NODE": f"{world}(x1)",
        # What srun sets for each task of a step (the batch script itself has none of these).
        "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_STEP_TASKS_PER_NODE": f"{world}(x1)",
    }
    if port is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def test_srun_tasks_without_a_rendezvous_address_are_refused_in_one_line(tmp_path: Path) -> None:
    import subprocess

    from train_support import train_env

    env = dict(train_env(), **_slurm_env(1, 2, None))
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    cmd = [sys.executable, str(ROOT / "train_clip.py"), "--train.output_dir", str(tmp_path / "run")]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "2 SLURM tasks (srun) without torchrun" in line and "MASTER_ADDR and MASTER_PORT" in line
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written


@pytest.mark.slow
def test_srun_tasks_join_one_process_group(small_data, tmp_path: Path) -> None:
    """Two processes started as srun starts them (SLURM's variables, no torchrun) train as the
    two ranks of one job, not as two independent jobs writing into one output_dir."""
    import subprocess

    from train_support import kill_tree, train_env

    (port,) = free_ports(1)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "train_clip.py"),
        *small_config_args(small_data, out, "--train.max_steps", "2"),
    ]
    cmd += ["--eval.at_end", "false"]
    procs = []
    try:
        for rank in (0, 1):
            env = dict(train_env(), **_slurm_env(rank, 2, port))
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )  # fmt: skip
            )
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
                p.communicate()
    for p, (stdout, stderr) in zip(procs, results, strict=True):
        assert p.returncode == 0, stdout + stderr
    start = [r for r in read_log(out) if r["type"] == "start"]
    assert len(start) == 1 and start[0]["world_size"] == 2 and start[0]["backend"] == "gloo"
    assert [r["step"] for r in read_log(out) if r["type"] == "step"] == [1, 2]
