"""transformers.Trainer with a ShardLoader: each rank reads its own exact share, our loader state
lives in Trainer's checkpoint folder, and ``resume_from_checkpoint`` restores it instead of
re-reading the batches already trained on.

    trainer = ShardTrainer(model=model, args=args, train_loader=loader, collator=CLIPCollator())
    trainer.train(resume_from_checkpoint=True)

Trainer calls ``train_dataloader.set_epoch(epoch)`` and draws exactly the batches of one update
step at a time (no read-ahead past the step), so the state saved at step n is that of the
n x gradient_accumulation_steps batches it trained on.

Trainer sizes every epoch by ``len(train_dataloader)`` read once, when training starts, and
derives the epoch it resumes in from the global step. Both are wrong after a resume onto another
world size: the resumed epoch holds the steps done before the stop (at the old world size) plus
the batches left, the epochs after it hold a whole epoch at the new one, and the global step no
longer divides into epochs. So :class:`ShardTrainer` takes the resumed epoch from the loader's
state, gives each epoch the length of the pass it is about to run, and counts ``max_steps`` (what
the learning-rate schedule spans) as the steps before the resume plus those of the epochs asked for.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from shardstream.integrations import require
from shardstream.integrations._stateful import FrameworkLoader, check_rank
from shardstream.kinds.interleaved import InterleavedLoader
from shardstream.kinds.naflex_budget import NaFlexBudgetLoader
from shardstream.kinds.text import TextBatch, TextLoader
from shardstream.loader import Batch, ShardLoader

transformers = require("transformers", "hf", "hf")
torch = require("torch", "hf", "hf")

__all__ = ["CLIPCollator", "CausalLMCollator", "Siglip2Collator", "ShardTrainer"]

# The file beside Trainer's own in each checkpoint-N folder.
LOADER_STATE_NAME = "shardstream_loader.json"
# CLIP's image normalisation (open_clip's OPENAI_DATASET_MEAN/STD, CLIPImageProcessor's defaults).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class CLIPCollator:
    """A :class:`Batch` as ``transformers.CLIPModel`` takes it: ``pixel_values`` (float32,
    normalised), ``input_ids`` and ``attention_mask`` from the loader's tokens (make the loader
    with ``tokenizer=``, e.g. ``"ViT-B-32"``: CLIP's BPE, padded with ``pad_token_id``), and
    ``return_loss=True``.

    Args:
        mean: Per-channel mean of the normalisation, on the 0-1 scale (default: CLIP's).
        std: Per-channel standard deviation, on the 0-1 scale (default: CLIP's).
        pad_token_id: The token id that marks padding, for ``attention_mask`` (default 0).
    """

    def __init__(
        self,
        mean: tuple[float, float, float] = CLIP_MEAN,
        std: tuple[float, float, float] = CLIP_STD,
        pad_token_id: int = 0,
    ) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        self.pad_token_id = pad_token_id

    def __call__(self, batch: Batch) -> dict[str, Any]:
        if batch.tokens is None:
            raise ValueError("CLIPCollator needs tokenized captions: make the ShardLoader with tokenizer=")
        tokens = torch.as_tensor(batch.tokens)
        pixels = (torch.as_tensor(batch.images).float() - self.mean) / self.std
        return {
            "pixel_values": pixels,
            "input_ids": tokens,
            "attention_mask": (tokens != self.pad_token_id).long(),
            "return_loss": True,
        }


class Siglip2Collator:
    """A :class:`~shardstream.NaFlexBatch` as ``transformers.Siglip2Model`` takes it:
    ``pixel_values`` rescaled to [-1, 1] (its processors' mean and std of 0.5, on whatever device
    the batch is on), ``pixel_attention_mask``, ``spatial_shapes``, ``input_ids`` from the
    loader's tokens (make the loader with ``tokenizer=``, e.g. SigLIP 2's Gemma
    ``tokenizer.json``; SigLIP pads to the context length and uses no attention mask) and
    ``return_loss=True``.
    """

    def __call__(self, batch: Any) -> dict[str, Any]:
        if batch.tokens is None:
            raise ValueError(
                "Siglip2Collator needs tokenized captions: make the loader (ShardLoader or "
                "NaFlexBudgetLoader) with tokenizer="
            )
        return {
            "pixel_values": torch.as_tensor(batch.pixel_values).float() / 127.5 - 1.0,
            "pixel_attention_mask": torch.as_tensor(batch.pixel_attention_mask),
            "spatial_shapes": torch.as_tensor(batch.spatial_shapes),
            "input_ids": torch.as_tensor(batch.tokens),
            "return_loss": True,
        }


class CausalLMCollator:
    """A :class:`~shardstream.TextBatch` as a ``transformers`` causal LM (GPT-2, Llama, Qwen)
    takes it: ``input_ids``, ``labels`` (the same ids: the model shifts them inside its loss)
    and, when the loader was made with ``boundaries=True``, ``position_ids`` restarting at every
    document (what transformers' flash-attention paths read document boundaries from, as with
    its ``DataCollatorWithFlattening``). Packed rows hold no padding, so no attention mask.
    """

    def __call__(self, batch: TextBatch) -> dict[str, Any]:
        ids = torch.as_tensor(batch.input_ids).long()
        out = {"input_ids": ids, "labels": ids.clone()}
        if batch.position_ids is not None:
            out["position_ids"] = torch.as_tensor(batch.position_ids)
        return out


def _updates(batches: int, accumulate: int) -> int:
    """Optimizer steps of a pass of ``batches`` batches (a last partial accumulation is a step)."""
    return max(math.ceil(batches / accumulate), 1)


def _checkpoint_global_step(folder: str) -> int:
    """The global step Trainer saved in ``folder`` (0 where its state file is missing)."""
    path = os.path.join(folder, transformers.trainer.TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return int(json.load(f).get("global_step", 0))


class ShardTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` that trains on ``train_loader`` (this rank's ShardLoader).

    - The loader is handed to Trainer as it is, not through ``accelerator.prepare``: nothing is
      dispatched from rank 0 or split (``dispatch_batches`` and ``split_batches`` are set off
      as well, for any DataLoader the user prepares besides).
    - ``collator(batch)`` turns each batch into the model's inputs (:class:`CLIPCollator` for
      ``CLIPModel``); with ``num_workers`` (default: ``args.dataloader_num_workers``) > 0 the
      loader reads through that many DataLoader worker processes.
    - Each checkpoint-N folder gets ``shardstream_loader.json``; ``train(resume_from_checkpoint=...)``
      loads it and sets ``ignore_data_skip``, so the epoch continues at the exact next batch, also
      on another world size (the rest of the epoch is re-planned, each sample once).

    Args:
        *args: ``transformers.Trainer``'s positional arguments (``model``, ``args``, ...).
        train_loader: This rank's :class:`~shardstream.ShardLoader`,
            :class:`~shardstream.TextLoader`, :class:`~shardstream.NaFlexBudgetLoader` or
            :class:`~shardstream.InterleavedLoader`
            (required; instead of ``train_dataset``).
        collator: ``fn(batch)`` into the model's inputs (:class:`CLIPCollator` for
            ``CLIPModel``, :class:`CausalLMCollator` for a causal LM on a TextLoader). None
            (default): the batch itself.
        num_workers: DataLoader worker processes. None (default):
            ``args.dataloader_num_workers``.
        **kwargs: ``transformers.Trainer``'s keyword arguments.

    Raises:
        ValueError: The loader reads another rank's share than Trainer's process.
    """

    def __init__(
        self,
        *args: Any,
        train_loader: ShardLoader | TextLoader | NaFlexBudgetLoader | InterleavedLoader,
        collator: Callable[[Any], Any] | None = None,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None:
            config = training_args.accelerator_config
            if isinstance(config, dict):
                config.update(dispatch_batches=False, split_batches=False)
            elif config is not None and not isinstance(config, str):
                config.dispatch_batches, config.split_batches = False, False
        super().__init__(*args, **kwargs)
        check_rank(train_loader, self.args.process_index, self.args.world_size, "transformers.Trainer")
        workers = self.args.dataloader_num_workers if num_workers is None else num_workers
        self.shard_loader = FrameworkLoader(train_loader, num_workers=workers, convert=collator)
        # The global step of the checkpoint being resumed (None: a fresh start).
        self._resumed_global_step: int | None = None

    def get_train_dataloader(self) -> Any:
        return self.shard_loader

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train`` that also restores the loader's position.

        Args:
            resume_from_checkpoint: A checkpoint-N folder, True (the last one in
                ``output_dir``), or None/False (start afresh).
            *args: Passed to ``transformers.Trainer.train``.
            **kwargs: Passed to ``transformers.Trainer.train``.

        Returns:
            What ``transformers.Trainer.train`` returns.

        Raises:
            ValueError: True but ``output_dir`` holds no checkpoint.
            FileNotFoundError: The checkpoint has no ``shardstream_loader.json`` (not written
                by ShardTrainer), so the position in the epoch is unknown.
        """
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            found = transformers.trainer_utils.get_last_checkpoint(self.args.output_dir)
            if found is None:
                raise ValueError(f"no checkpoint to resume in output_dir {self.args.output_dir!r}")
            resume_from_checkpoint = found
        if resume_from_checkpoint:
            path = os.path.join(str(resume_from_checkpoint), LOADER_STATE_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{path} does not exist: the checkpoint was not written by ShardTrainer, so the "
                    "loader's position in the epoch is unknown"
                )
            with open(path, encoding="utf-8") as f:
                self.shard_loader.load_state_dict(json.load(f))
            # Our state replaces Trainer's re-reading of the batches already trained on.
            self.args.ignore_data_skip = True
            self._resumed_global_step = _checkpoint_global_step(str(resume_from_checkpoint))
        else:
            self._resumed_global_step = None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def set_initial_training_values(self, args: Any, dataloader: Any) -> tuple[Any, ...]:
        """Trainer's sizes, with ``max_steps`` counted pass by pass (see the module docstring):
        the steps before a resume, then the pass being resumed, then whole epochs at this world
        size up to ``num_train_epochs``. With ``max_steps`` set, epochs run until it is reached.

        Args:
            args: The ``TrainingArguments`` Trainer passes.
            dataloader: The training DataLoader; sized pass by pass only when it is this
                trainer's loader, else as Trainer sizes it.

        Returns:
            Trainer's tuple of sizes (as ``transformers.Trainer.set_initial_training_values``).
        """
        values = list(super().set_initial_training_values(args, dataloader))
        if dataloader is not self.shard_loader:
            return tuple(values)
        accumulate = args.gradient_accumulation_steps
        if args.max_steps > 0:
            values[0] = sys.maxsize  # num_train_epochs: the run ends at max_steps, epochs of any length
            return tuple(values)
        epoch = self.shard_loader.epoch if self._resumed_global_step is not None else 0
        before = self._resumed_global_step or 0
        this_pass = _updates(self.shard_loader.pass_batches(epoch), accumulate)
        whole = _updates(self.shard_loader.whole_epoch_batches(), accumulate)
        later = max(0.0, args.num_train_epochs - epoch - 1)
        values[6] = before + this_pass + math.ceil(later * whole)  # max_steps
        return tuple(values)

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        # Trainer derives the resumed epoch as global_step // steps_per_epoch, which is wrong once
        # the world size changed; the loader's state knows it. Nothing is skipped: the loader
        # resumes at the next batch itself (ignore_data_skip).
        epochs_trained, steps_trained = super()._init_training_state(*args, **kwargs)
        if self._resumed_global_step is not None:
            return self.shard_loader.epoch, 0
        return epochs_trained, steps_trained

    def _run_epoch(self, **kwargs: Any) -> Any:
        # Each pass sized by what it yields: the rest of a resumed epoch, else a whole epoch at
        # this world size (Trainer's own figures are the first pass's, read once).
        if kwargs.get("train_dataloader") is self.shard_loader:
            batches = self.shard_loader.pass_batches(kwargs["epoch"])
            kwargs["steps_in_epoch"] = batches
            kwargs["num_update_steps_per_epoch"] = _updates(batches, self.args.gradient_accumulation_steps)
        return super()._run_epoch(**kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Every rank runs this hook, in step: the state's reserve-use gather is a collective.
        state = self.shard_loader.state_dict()
        folder = f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        output_dir = os.path.join(self._get_output_dir(trial=trial), folder)
        if self.args.should_save:
            # Written before Trainer's files, so a folder Trainer considers complete has it.
            os.makedirs(output_dir, exist_ok=True)
            temporary = os.path.join(output_dir, LOADER_STATE_NAME + ".tmp")
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(temporary, os.path.join(output_dir, LOADER_STATE_NAME))
        super()._save_checkpoint(model, trial)
