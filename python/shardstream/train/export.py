"""``python -m shardstream.train export CHECKPOINT -o model.pt``: a training checkpoint's weights as
an open_clip state dict, which ``open_clip.create_model(name, pretrained="model.pt")`` loads (and
with it CLIP_benchmark and DataComp's evaluation: ``--model NAME --pretrained model.pt``).

The model name and input size come from the checkpoint's config. A model whose config open_clip
does not ship (``shardstream-tiny``) gets its config JSON written beside the weights, named after
the model, so that open_clip alone loads it::

    import open_clip
    open_clip.add_model_config("out/shardstream-tiny.json")
    model = open_clip.create_model("shardstream-tiny", pretrained="out/model.pt")

The command prints the exact calls for the checkpoint at hand.

A sharded checkpoint (the folder ``step-N.dcp`` that ``dist.strategy: fsdp`` writes) is read in
this one process, without a process group: the model is built from the checkpoint's config and
its weights are read from every rank's shards (``fsdp.load_model_weights``), whatever the number
of ranks that wrote them.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstream._stderr import say

PROG = "python -m shardstream.train export"


class ExportError(ValueError):
    """The checkpoint cannot be exported (missing, not a checkpoint, no model config in it)."""


@dataclass(frozen=True)
class Exported:
    weights: Path
    model_name: str
    step: int
    parameters: int
    model_config: Path | None  # the config JSON written beside the weights, for a model open_clip lacks
    force_image_size: int | None  # the input size the run overrode, which create_model must be told

    def open_clip_calls(self) -> list[str]:
        """The Python lines that load the export with open_clip alone."""
        lines = ["import open_clip"]
        if self.model_config is not None:
            lines.append(f"open_clip.add_model_config({str(self.model_config)!r})")
        size = f", force_image_size={self.force_image_size}" if self.force_image_size else ""
        lines.append(
            f"model = open_clip.create_model({self.model_name!r}, pretrained={str(self.weights)!r}{size})"
        )
        lines.append(f"tokenizer = open_clip.get_tokenizer({self.model_name!r})")
        return lines


def _trained_config(payload: dict[str, Any], path: Path) -> tuple[str, int]:
    """(model name, data.image_size) of the run that wrote the checkpoint."""
    try:
        config = json.loads(payload["config_json"])
        return str(config["model"]["name"]), int(config["data"].get("image_size") or 0)
    except (KeyError, TypeError, ValueError):
        raise ExportError(f"{path}: the checkpoint holds no model config (model.name)") from None


def _sharded_weights(path: Path, name: str, image_size: int) -> dict[str, Any]:
    """The model weights of a DCP folder, read into a model built as the run built it (CPU, fp32)."""
    import open_clip

    from shardstream.train import fsdp
    from shardstream.train.model import register_model_configs

    register_model_configs()
    level = logging.getLogger().level  # open_clip warns that no pretrained weights are loaded: expected
    logging.getLogger().setLevel(logging.ERROR)
    try:
        model = open_clip.create_model(
            name, precision="fp32", device="cpu", force_image_size=image_size or None
        )
    finally:
        logging.getLogger().setLevel(level)
    try:
        return fsdp.load_model_weights(path, model.state_dict())
    except (RuntimeError, KeyError) as e:  # DCP: missing keys, other shapes
        raise ExportError(
            f"{path}: cannot read the model weights: {str(e).strip().splitlines()[0]}"
        ) from None


def export_checkpoint(checkpoint: str | Path, output: str | Path) -> Exported:
    """Writes the checkpoint's model weights to ``output`` (atomically) as a plain open_clip
    state dict, and the model's config JSON beside it where open_clip does not ship it."""
    import torch

    from shardstream._files import AtomicFile
    from shardstream.train import checkpoint as ckpt
    from shardstream.train import fsdp
    from shardstream.train.model import MODEL_CONFIG_DIR

    path, output = Path(checkpoint), Path(output)
    if not path.exists():
        raise ExportError(f"checkpoint not found: {path}")
    try:
        if path.is_dir():
            payload = fsdp.load_trainer_state(path)
            name, image_size = _trained_config(payload, path)
            state = _sharded_weights(path, name, image_size)
        else:
            payload = ckpt.load_checkpoint(path)
            name, image_size = _trained_config(payload, path)
            state = payload.get("model")
    except ValueError as e:
        raise ExportError(str(e)) from None
    if not isinstance(state, dict) or not state:
        raise ExportError(f"{path}: the checkpoint holds no model weights")
    output.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(output, fsync=True) as f:
        torch.save(state, f.file)

    own_config = MODEL_CONFIG_DIR / f"{name}.json"
    model_config = None
    force_image_size = image_size or None
    if own_config.is_file():
        config = json.loads(own_config.read_text(encoding="utf-8"))
        if image_size:  # the size the run used is the config's own: no override to remember
            config["vision_cfg"]["image_size"] = image_size
            force_image_size = None
        model_config = output.with_name(f"{name}.json")
        with AtomicFile(model_config, fsync=True) as f:
            f.file.write(json.dumps(config, indent=4).encode() + b"\n")
    parameters = sum(t.numel() for t in state.values() if hasattr(t, "numel"))
    return Exported(output, name, int(payload.get("step", 0)), parameters, model_config, force_image_size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Write a training checkpoint's weights as an open_clip state dict "
        "(open_clip.create_model(name, pretrained=FILE) loads it).",
    )
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a checkpoint file (output_dir/checkpoints/step-N.pt) or sharded checkpoint folder (step-N.dcp)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the state dict to write, e.g. model.pt"
    )
    args = parser.parse_args(argv)
    try:
        exported = export_checkpoint(args.checkpoint, args.output)
    except (ExportError, OSError) as e:
        say(f"{PROG}: error: {e}")
        return 2
    print(
        f"exported step {exported.step} of {exported.model_name} ({exported.parameters / 1e6:.1f} M "
        f"parameters) to {exported.weights}"
        + (f", its model config to {exported.model_config}" if exported.model_config else "")
    )
    print("load it with open_clip:")
    for line in exported.open_clip_calls():
        print(f"    {line}")
    return 0
