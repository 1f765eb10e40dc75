"""The training loop: set-up, steps, evaluation and checkpoint hooks, resume."""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardstream._stderr import say
from shardstream.errors import ShardError
from shardstream.progress import progress_wanted
from shardstream.train import checkpoint as ckpt
from shardstream.train import fsdp
from shardstream.train.callbacks import (
    Callback,
    CallbackList,
    Checkpointer,
    ConsoleLogger,
    Evaluator,
    JsonlLogger,
    TensorBoardLogger,
    load_callback,
)
from shardstream.train.checkpoint_async import BackgroundWriter, CheckpointWriteError
from shardstream.train.config import Config, ConfigError, config_to_yaml
from shardstream.train.deps import check as check_dependencies
from shardstream.train.deps import installed
from shardstream.train.device_setup import build_optimizer, intra_op_threads
from shardstream.train.dist import (
    DistContext,
    StopVote,
    broadcast_json,
    init_distributed,
    reduce_over_ranks,
    shutdown,
)
from shardstream.train.evaluate import evaluate as run_evaluation
from shardstream.train.evaluate import rank_local_loss
from shardstream.train.inputs import InputPipeline
from shardstream.train.loaders import DataSources, heldout_loader, resolve_sources, train_loader
from shardstream.train.loss import contrastive_backward, make_loss, resolve_loss_kind
from shardstream.train.metrics import StepMetrics
from shardstream.train.model import (
    autocast_factory,
    create_model,
    grad_scaler,
    lock_towers,
    param_groups,
    unwrap,
)
from shardstream.train.schedule import WarmupCosine, global_batch_size, resolve_rule, scale_lr
from shardstream.train.storage import CheckpointStore, open_store
from shardstream.train.zeroshot import ZeroShotSet, evaluate_zeroshot, load_zeroshot_set, zeroshot_loader

LOGIT_SCALE_MAX = math.log(100.0)  # CLIP clamps the temperature so logits stay below 100x


def rank_seed(seed: int, rank: int, *more: int) -> int:
    """A seed of its own for each rank (and resume step), derived from the run's seed."""
    return int(np.random.SeedSequence([seed, rank, *more]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Trainer:
    """One training run. ``Trainer(cfg, callbacks).run()``; or ``shardstream.train.train``."""

    def __init__(self, cfg: Config, callbacks: Sequence[Callback] = ()) -> None:
        self.cfg = cfg
        self.user_callbacks = list(callbacks)
        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.finished = False
        self.last_eval: dict[str, float] = {}
        self._stop_requested = False
        self._stop_signal: str | None = None  # set by the SIGTERM handler
        self._t0 = time.perf_counter()
        self.wandb_run_id: str | None = None  # kept in checkpoints: a resume continues the wandb run

    # -- public helpers for callbacks ------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    def wall_time(self) -> float:
        return time.perf_counter() - self._t0

    def request_stop(self) -> None:
        """End the run after the next step (on any rank: all ranks stop together, at the same
        step; the ranks agree on it one step late, so that no step waits for the others)."""
        self._stop_requested = True

    def log(self, message: str) -> None:
        if self.ctx.is_main:
            print(message, flush=True)

    def summary(self) -> dict[str, Any]:
        return {
            "world_size": self.ctx.world_size,
            "backend": self.ctx.backend,
            "device": str(self.ctx.device),
            "global_batch": self.global_batch,
            "lr": self.lr_scaling.lr,
            "lr_scaling": self.lr_scaling.describe(),
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "start_step": self.step,
            "model": self.cfg.model.name,
            "loss": self.loss_kind,
            "strategy": self.cfg.dist.strategy,
            "precision": self.cfg.model.precision,
            "config": self.cfg.to_dict(),
        }

    # -- set-up -------------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        torch.set_num_threads(intra_op_threads(cfg.train.torch_threads, ctx.local_world_size, os.cpu_count()))
        if ctx.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
            torch.backends.cudnn.allow_tf32 = cfg.train.tf32
        # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
        seed_everything(cfg.train.seed)

        self.output_dir = Path(cfg.train.output_dir)
        self.store: CheckpointStore = open_store(cfg.checkpoint.dir, self.output_dir)
        self.writer = BackgroundWriter(cfg.checkpoint.writer_priority)
        self._snapshot: dict[str, Any] | None = None  # rank 0's last checkpoint in host memory
        if ctx.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(config_to_yaml(cfg), encoding="utf-8")
        try:  # every rank: each one may have to read a checkpoint from it
            self.store.check()
        except (OSError, ShardError) as e:
            raise ConfigError(f"checkpoint.dir: cannot use {self.store.describe()}: {e}") from None

        # The model first: a wrong model name fails before any demo data is generated.
        self.bundle = create_model(
            cfg.model.name,
            pretrained=cfg.model.pretrained,
            device=ctx.device,
            grad_checkpointing=cfg.model.grad_checkpointing,
            image_size=cfg.data.image_size or None,
            tokenizer=cfg.model.tokenizer,
            precision=cfg.model.precision,
        )
        # before any data: a loss the model cannot train is a config error naming both
        self.loss_kind = resolve_loss_kind(cfg.model.loss, self.bundle.model, cfg.model.name)
        lock_towers(self.bundle.model, cfg.model)
        # From here on each rank draws its own random numbers (dropout, patch dropout masks):
        # the same stream on every rank would drop the same units of every rank's samples.
        seed_everything(rank_seed(cfg.train.seed, ctx.rank))
        self.sources: DataSources = resolve_sources(cfg, ctx, self.log)
        self.zeroshot: ZeroShotSet | None = None
        if self.sources.zeroshot:
            self.zeroshot = load_zeroshot_set(
                self.sources.zeroshot, split=cfg.eval.zeroshot_split, index=self.sources.zeroshot_index or ""
            )
        model = self.bundle.model
        self.sharded = cfg.dist.strategy == "fsdp"
        if self.sharded:
            model = fsdp.shard(model, ctx, cfg.model.precision)  # in place: bundle.model is sharded too
        elif ctx.world_size > 1:
            # Buffers (attention masks) are constants: no need to sync them every forward.
            model = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                forward_sync_buffers=False,
            )
        if cfg.train.compile:
            # Over the DDP wrapper: its graph breaks at the gradient buckets, so the all-reduce of
            # one bucket overlaps the backward of the next, as without compile.
            model = torch.compile(model)
        self.model = model
        self.autocast = autocast_factory(cfg.model.precision, ctx.device)
        self.scaler = grad_scaler(cfg.model.precision, ctx.device)
        # fp16 steps skipped for overflowing gradients, counted on the device (read when logged)
        self._skipped = torch.zeros((), dtype=torch.int64, device=ctx.device) if self.scaler else None
        self.loss_fn = make_loss(
            self.loss_kind,
            ctx.rank,
            ctx.world_size,
            siglip_exchange=cfg.model.siglip_exchange,
            coca_contrastive_weight=cfg.model.coca_contrastive_weight,
            coca_caption_weight=cfg.model.coca_caption_weight,
        )
        self.metrics = StepMetrics(ctx)

        self.image_size = self.bundle.image_size
        self.loader: Any = train_loader(cfg, self.sources, self.image_size, ctx, self.bundle.context_length)
        if self.sources.heldout is not None:
            # fail now, not after training
            heldout_loader(cfg, self.sources, self.image_size, ctx, self.bundle.context_length)
        if self.zeroshot is not None:
            zeroshot_loader(cfg, self.zeroshot, self.image_size, ctx)
            self.log(self.zeroshot.describe())
        try:
            batches_per_epoch = len(self.loader)
        except TypeError:
            raise ConfigError(
                "data.train_index: the epoch length is unknown; give an index or data.samples_per_epoch"
            ) from None
        self.accum = cfg.train.accum_steps
        bundle = self.bundle
        self.inputs = InputPipeline(
            ctx.device,
            self.accum,
            normalise=lambda images: bundle.normalise(images, ctx.device),
            # looked up on every call, so that a callback may wrap it
            tokenizer=lambda texts: bundle.tokenizer(texts),
            context_length=bundle.context_length,
        )
        self._batches_used = 0  # loader batches of this epoch that steps consumed (not just staged)
        self.steps_per_epoch = batches_per_epoch // self.accum
        self.global_batch = global_batch_size(cfg.train.batch_size, ctx.world_size, self.accum)
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"train.batch_size: one step needs {self.global_batch} samples (batch {cfg.train.batch_size} "
                f"x {ctx.world_size} ranks x {self.accum} accumulation), more than the epoch gives each rank "
                f"({batches_per_epoch} batches); lower the batch size or add data"
            )
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch

        rule = resolve_rule(cfg.optim.lr_scaling, cfg.optim.optimizer)
        self.lr_scaling = scale_lr(cfg.optim.base_lr, cfg.optim.base_batch, self.global_batch, rule)
        groups = param_groups(self.bundle.model, cfg.optim.weight_decay, cfg.optim.no_decay)
        self.optimizer: torch.optim.Optimizer = build_optimizer(
            groups, cfg.optim, ctx.device.type, self.lr_scaling.lr
        )
        self.scheduler = WarmupCosine(
            self.optimizer,
            peak_lr=self.lr_scaling.lr,
            total_steps=self.total_steps,
            warmup_steps=cfg.optim.warmup_steps,
            schedule=cfg.optim.schedule,
            min_ratio=cfg.optim.min_lr_ratio,
            cooldown_steps=cfg.optim.cooldown_steps,
            cooldown_power=cfg.optim.cooldown_power,
        )

        builtins: list[Callback] = [JsonlLogger(self.output_dir / "log.jsonl")]
        if cfg.log.tensorboard:
            builtins.append(TensorBoardLogger(self.output_dir / "tensorboard"))
        progress = {"on": True, "off": False}.get(
            cfg.log.progress, progress_wanted(sys.stderr) and installed("tqdm")
        )
        if cfg.log.wandb:
            from shardstream.train.wandb_logger import WandbLogger

            log = cfg.log
            builtins.append(WandbLogger(log.wandb_project, log.wandb_name, log.wandb_entity, log.wandb_tags))
        builtins.append(ConsoleLogger(cfg.log.every_steps, progress))
        if self.sources.heldout is not None or self.zeroshot is not None:
            builtins.append(Evaluator(cfg.eval.every_steps, cfg.eval.at_end))
        builtins.append(Checkpointer(cfg.checkpoint.every_steps, cfg.checkpoint.at_end))
        configured = [load_callback(spec) for spec in cfg.train.callbacks]
        self.callbacks = CallbackList(builtins + configured + self.user_callbacks)

        self._resume_loader_state: dict[str, Any] | None = None
        self._epoch_end_step = self.steps_per_epoch  # the step that completes the current epoch
        if cfg.train.resume:
            self._resume(cfg.train.resume)

    def _resume(self, spec: str) -> None:
        cfg, ctx = self.cfg, self.ctx
        # rank 0 chooses; every rank checks that it holds the same bytes before loading them
        identity = ckpt.agree_on_checkpoint(ctx, spec, self.store, scratch=self.output_dir)
        if identity is None:  # `latest` on a job's first attempt: nothing to resume yet
            self.log(f"resume latest: no checkpoint in {self.store.describe()} yet, starting from scratch")
            return
        assert identity.local is not None
        local = Path(identity.local)
        path = self.store.describe(identity.name) if identity.in_directory else identity.name
        if fsdp.is_sharded(local) != self.sharded:  # the parameters' shapes and keys differ
            kind, other = (
                ("sharded (FSDP)", "fsdp") if fsdp.is_sharded(local) else ("single-file (DDP)", "ddp")
            )
            raise ConfigError(
                f"train.resume: {path} is a {kind} checkpoint; resume it with dist.strategy {other}"
            )
        try:
            if self.sharded:  # DCP reshards onto this run's ranks
                payload = fsdp.load_sharded(local, self.model, self.optimizer)
            else:
                payload = ckpt.load_checkpoint(local)
                unwrap(self.model).load_state_dict(payload["model"])
                self.optimizer.load_state_dict(payload["optimizer"])
        finally:
            ckpt.discard_download(local)  # a download from a remote store, once loaded
        self.scheduler.load_state_dict(payload["scheduler"])
        if self.scaler is not None and payload.get("scaler"):
            self.scaler.load_state_dict(payload["scaler"])
            self._skipped.fill_(int(payload["scaler"].get("skipped_steps", 0)))
        self.wandb_run_id = str(payload.get("wandb_run_id") or "") or None
        state = ckpt.training_state(payload)
        self.step, self.epoch, self.step_in_epoch = state.step, state.epoch, state.step_in_epoch
        self._epoch_end_step = self.step + self.steps_per_epoch
        if state.step_in_epoch > 0 and state.loader_state is not None:
            self._resume_loader_state = state.loader_state
            # The loader knows how many batches of this epoch are left for this rank: the same
            # count as before on the same world size, a re-planned one on another.
            self.loader.set_epoch(self.epoch)
            self.loader.load_state_dict(state.loader_state)
            self._epoch_end_step = self.step + len(self.loader) // self.accum
        if not self.cfg.train.max_steps:
            # `epochs` epochs in all (on a new world size the step count of the rest changes)
            later = max(0, cfg.train.epochs - self.epoch - 1) * self.steps_per_epoch
            self.total_steps = self._epoch_end_step + later
            self.scheduler.total_steps = self.total_steps
        saved_world = int(payload["world_size"])
        if saved_world == ctx.world_size:
            ckpt.set_rng_state(payload["rng"][ctx.rank])
        else:
            # Other ranks, other streams: derive fresh ones from (seed, rank, step).
            seed_everything(rank_seed(cfg.train.seed, ctx.rank, self.step))
            self.log(
                f"resume: checkpoint from {saved_world} ranks onto {ctx.world_size}: the rest of epoch "
                f"{self.epoch} is re-planned; RNG streams re-seeded"
            )
        self.log(
            f"resumed from {path} at step {self.step} (epoch {self.epoch}, step {self.step_in_epoch} in it)"
        )

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._t0 = time.perf_counter()
        check_dependencies(self.cfg)  # on every rank, before any process group, model or data
        self.ctx: DistContext = init_distributed(self.cfg.dist)
        restore_sigterm = None
        completed = False
        try:
            self._setup()
            self._announce()
            self.callbacks.on_train_start(self)
            restore_sigterm = self._stop_on_sigterm()
            self._train()
            self.finished = self.step >= self.total_steps
            self.flush_log()
            self.callbacks.on_train_end(self)
            self._settle_writes(self.cfg.checkpoint.flush_timeout_s or None)  # the last one too
            completed = True
            return {
                "step": self.step,
                "finished": self.finished,
                "wall_s": self.wall_time(),
                "eval": self.last_eval,
                "output_dir": str(self.output_dir),
            }
        finally:
            if not completed and hasattr(self, "writer"):
                # An error ends the run: still let the checkpoint in flight land (no collective).
                # The SIGTERM handler stays until it has: a peer's death makes torchrun SIGTERM
                # this rank at once, and the default action would drop the write half done.
                failed = self.writer.wait(self.cfg.checkpoint.flush_timeout_s or None)
                if failed:
                    say(f"train_clip.py: error: {failed}")
            if restore_sigterm is not None:
                restore_sigterm()
            shutdown(self.ctx, finished=completed)

    def _stop_on_sigterm(self) -> Any:
        """From the first step to the end of the run, SIGTERM (what a scheduler or torchrun sends
        before it kills) ends the run after the next step, with a checkpoint, on every rank
        together: the same path as ``request_stop``. Returns what puts the previous handler back,
        or None where signals cannot be caught (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            self._stop_signal = signal.Signals(signum).name
            self._stop_requested = True

        previous = signal.signal(signal.SIGTERM, handler)
        return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    def _announce(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        params = sum(p.numel() for p in self.bundle.model.parameters())
        backend = ctx.backend or "single process"
        precision = cfg.model.precision + (" with dynamic loss scaling" if self.scaler else "")
        self.log(
            f"shardstream CLIP training: {cfg.model.name} ({params / 1e6:.1f} M parameters, "
            f"{precision}, {self.loss_kind} loss) on {ctx.world_size} x {ctx.device.type} ({backend}"
            f"{', FSDP2' if self.sharded else ''})"
        )
        self.log(
            f"global batch {self.global_batch} = {cfg.train.batch_size} per device x {ctx.world_size} "
            f"ranks x {self.accum} accumulation; {self.steps_per_epoch} steps per epoch, "
            f"{self.total_steps} steps"
        )
        self.log(self.lr_scaling.describe())

    def _train(self) -> None:
        """Steps until the schedule ends, ``train.stop_at_step``, or a stop request. A request
        (SIGTERM, ``request_stop``) on any rank is agreed in ``StopVote``, one step late: the
        vote is a step's last act, so a request raised while step n runs (its callbacks
        included) stops every rank after step n + 1."""
        stop_at = self.cfg.train.stop_at_step
        vote = StopVote(self.ctx)
        self._steps(vote, stop_at)
        # No collective left in flight. Not after an error: a failed peer would never answer.
        vote.settle()

    def _steps(self, vote: StopVote, stop_at: int) -> None:
        while self.step < self.total_steps:
            self.loader.set_epoch(self.epoch)
            if self._resume_loader_state is not None:
                self.loader.load_state_dict(self._resume_loader_state)
                self._resume_loader_state = None
            batches = iter(self.loader)
            self.inputs.start(batches)
            self._batches_used = 0
            exhausted = False
            try:
                while self.step < self.total_steps and not self._epoch_complete():
                    metrics = self._train_step()
                    if metrics is None:  # not expected (the loader's length is exact): end the epoch
                        exhausted = True
                        break
                    if self.step % self.cfg.log.every_steps == 0:
                        metrics = self.flush_log()[-1]
                    self.callbacks.on_step_end(self, metrics)
                    if vote.cast(self._stop_requested) or self.step == stop_at:
                        if self._stop_signal is not None:
                            self.log(f"{self._stop_signal} received: stopping after step {self.step}")
                        return
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            if exhausted or self._epoch_complete():
                self.flush_log()
                self.callbacks.on_epoch_end(self, self._epoch_stats())
                self.epoch += 1
                self.step_in_epoch = 0
                self._epoch_end_step = self.step + self.steps_per_epoch

    def _epoch_stats(self) -> dict[str, Any]:
        """The loader's counters of the finished epoch, summed over ranks (a collective). The
        drop_last remainder is the global tail, which every rank reports: taken once."""
        stats = getattr(self.loader, "stats", None) or {}
        names = ("samples", "skipped_total", "replaced", "padded", "retries")
        local = torch.tensor([float(stats.get(n) or 0) for n in names], dtype=torch.float64)
        total = reduce_over_ranks(self.ctx, local, "sum").tolist()
        remainder = reduce_over_ranks(self.ctx, torch.tensor([float(stats.get("remainder") or 0)]), "max")
        out = {
            "epoch": self.epoch,
            **{n: int(v) for n, v in zip(names, total, strict=True)},
            "remainder": int(remainder[0]),
        }
        # A mixture: samples per source (the same sources, in the same order, on every rank).
        by_source = stats.get("samples_by_source") or {}
        if by_source:
            counts = torch.tensor([float(v) for v in by_source.values()], dtype=torch.float64)
            summed = reduce_over_ranks(self.ctx, counts, "sum").tolist()
            out["samples_by_source"] = {k: int(v) for k, v in zip(by_source, summed, strict=True)}
        return out

    def _epoch_complete(self) -> bool:
        return self.step >= self._epoch_end_step

    def flush_log(self) -> list[dict[str, Any]]:
        """Completes the step records since the last log with their device values (one read, the
        loss's mean over ranks in one collective: every rank calls this at the same steps) and
        passes them to ``on_log``. Returns them."""
        records = self.metrics.flush(self.global_batch)
        if records:
            self.callbacks.on_log(self, records)
        return records

    def _train_step(self) -> dict[str, Any] | None:
        """One optimizer step. Nothing here reads a value from the device: the host issues the
        step's work, prepares the next step's inputs while the device runs it, and moves on. The
        step's host record is returned; its device values wait in ``self.metrics``."""
        start = time.perf_counter()
        spent = dict(self.inputs.totals)
        inputs = self.inputs.take()  # staged during the previous step (prepared now on the first)
        if inputs is None:
            return None
        model_start = time.perf_counter()
        self.metrics.begin_compute()
        lr = self.scheduler.lr
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.scaler
        loss = contrastive_backward(
            self.model,
            self.loss_fn,
            inputs.micro,
            autocast=self.autocast,
            scale=scaler.scale if scaler is not None else None,
        )
        if scaler is not None:
            scaler.unscale_(self.optimizer)  # clip the true gradient, not the scaled one
        grad_norm = None
        if self.cfg.train.grad_clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip_norm)
            grad_norm = fsdp.full(grad_norm)  # FSDP: a DTensor of the ranks' partial norms
        loss_scale = None
        if scaler is not None:
            before = scaler._get_scale_async()  # a device tensor: comparing it does not sync
            assert before is not None
            before = before.clone()
            scaler.step(self.optimizer)  # fused AdamW takes found_inf on the device (no sync)
            scaler.update()
            loss_scale = scaler._get_scale_async()
            assert loss_scale is not None and self._skipped is not None
            self._skipped += (loss_scale < before).to(torch.int64)  # the scale backs off on overflow only
            loss_scale = loss_scale.clone()
        else:
            self.optimizer.step()
        self.scheduler.step()
        logit_scale = unwrap(self.model).logit_scale
        logit_bias = getattr(unwrap(self.model), "logit_bias", None)
        with torch.no_grad():
            logit_scale.clamp_(0.0, LOGIT_SCALE_MAX)
        self.metrics.end_compute()
        model_end = time.perf_counter()

        self.step += 1
        self.step_in_epoch += 1
        self._batches_used += len(inputs.batches)
        if self.step < self.total_steps and not self._epoch_complete():
            self.inputs.stage()  # step n+1's loader wait, tokens and copies, beside step n's device work
        end = time.perf_counter()
        elapsed = end - start
        input_s = elapsed - (model_end - model_start)
        record: dict[str, Any] = {
            "step": self.step,
            "epoch": self.epoch,
            "lr": lr,
            "samples_per_s": self.global_batch / elapsed,
            # host time between two model steps that was not the model: the loader, tokenizing,
            # normalising, the copies to the device (taking this step's, staging the next one's)
            "input_frac": input_s / elapsed,
            "input_s": input_s,
            # its parts spent in this interval (the rest of input_s: handing over, bookkeeping)
            **{k: v - spent[k] for k, v in self.inputs.totals.items()},
            "step_time_s": elapsed,
            "wall_s": self.wall_time(),
        }
        if self.cfg.log.log_keys:
            record["keys"] = [key for b in inputs.batches for key in b.keys]
        self.metrics.add(
            record,
            loss,
            grad_norm=grad_norm,
            logit_scale=fsdp.full(logit_scale.detach()).exp(),
            logit_bias=fsdp.full(logit_bias.detach()).clone() if logit_bias is not None else None,
            loss_scale=loss_scale,
            skipped_steps=self._skipped.clone() if self._skipped is not None else None,
        )
        return record

    # -- evaluation and checkpoints (collectives: every rank calls them) ----------------------------
    def evaluate(self) -> dict[str, float]:
        """Retrieval and validation loss on the held-out set, zero-shot accuracy on the labelled
        set (either may be off); a collective: every rank calls it."""
        if self.sources.heldout is None and self.zeroshot is None:
            return {}
        self.flush_log()  # the steps before it come first in the log
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.sources.heldout is not None:
            metrics.update(
                run_evaluation(
                    self.bundle,
                    heldout_loader(
                        self.cfg, self.sources, self.image_size, self.ctx, self.bundle.context_length
                    ),
                    ctx=self.ctx,
                    autocast=self.autocast,
                    recall_k=self.cfg.eval.recall_k,
                    loss_fn=rank_local_loss(self.loss_fn),
                )
            )
        if self.zeroshot is not None:
            metrics.update(
                evaluate_zeroshot(
                    self.bundle,
                    zeroshot_loader(self.cfg, self.zeroshot, self.image_size, self.ctx),
                    self.zeroshot,
                    ctx=self.ctx,
                    autocast=self.autocast,
                )
            )
        metrics["eval_s"] = time.perf_counter() - start
        self.last_eval = metrics
        self.callbacks.on_eval(self, metrics)
        return metrics

    def training_state(self) -> ckpt.TrainingState:
        if self._epoch_complete():
            return ckpt.TrainingState(self.step, self.epoch + 1, 0, None)
        # A collective (save_checkpoint runs on every rank): gathers the ranks' reserve use. The
        # position is that of the batches the steps used: the next step's, already staged, are
        # read again on resume.
        loader_state = self.loader.state_dict(batches=self._batches_used, gather=True)
        return ckpt.TrainingState(self.step, self.epoch, self.step_in_epoch, loader_state)

    def save_checkpoint(self) -> str | None:
        """Snapshots the state at this step and writes it (a collective: every rank calls it).
        The write runs on rank 0's background thread unless ``checkpoint.async_write`` is off;
        the previous write is waited for first, and its failure raised here on every rank."""
        self.flush_log()  # the log holds every step the checkpoint holds
        self._settle_writes(None)
        extra = {}
        if self.scaler is not None:
            assert self._skipped is not None
            extra["scaler"] = {**self.scaler.state_dict(), "skipped_steps": int(self._skipped)}
        if self.wandb_run_id:
            extra["wandb_run_id"] = self.wandb_run_id
        if self.sharded:
            # every rank writes its own shards, synchronously (see fsdp.py: publishing `latest`
            # needs every rank's upload done, a collective the background thread cannot run)
            written = fsdp.save_sharded(
                self.store,
                ctx=self.ctx,
                model=unwrap(self.model),
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                state=self.training_state(),
                config=self.cfg.to_dict(),
                keep=self.cfg.checkpoint.keep,
                extra=extra,
            )
            shown = str(written) if written is not None else None
            self.callbacks.on_checkpoint(self, shown)
            return shown
        payload = ckpt.snapshot_checkpoint(
            ctx=self.ctx,
            model=unwrap(self.model),
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=self.training_state(),
            config=self.cfg.to_dict(),
            extra=extra,
            # the previous snapshot's buffers, its write done (settled above): no fresh pages
            reuse=self._snapshot,
        )
        self._snapshot = payload
        name = ckpt.checkpoint_name(self.step)
        shown = None
        if payload is not None:
            store, keep = self.store, self.cfg.checkpoint.keep
            shown = store.describe(name)
            self.writer.submit(shown, lambda: ckpt.write_checkpoint(store, payload, keep))
        if not self.cfg.checkpoint.async_write:
            self._settle_writes(None)
        self.callbacks.on_checkpoint(self, shown)
        return shown

    def _settle_writes(self, timeout: float | None) -> None:
        """Waits for rank 0's checkpoint write in flight (at most ``timeout`` s) and raises its
        failure on every rank (a collective: one small broadcast)."""
        error = self.writer.wait(timeout) if self.ctx.is_main else None
        error = broadcast_json(self.ctx, {"error": error})["error"]
        if error:
            raise CheckpointWriteError(error)


def train(cfg: Config, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Runs training as configured (call it in every process torchrun starts)."""
    return Trainer(cfg, callbacks).run()


__all__ = ["Trainer", "train"]
