"""The trainer's third-party packages, checked against the config before anything starts.

``shardstream`` itself needs numpy only; the trainer needs the ``train`` extra
(``pip install 'shardstream[train]'``: torch, open_clip_torch, pyyaml, tensorboard). A missing
package must not surface as a raw ``ModuleNotFoundError`` on one rank deep inside the run (and a
"Connection closed by peer" on the others): ``check`` runs on every rank before any process group,
model or data exists, and says in one line what to install, or which setting does without it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardstream.train.config import Config

EXTRA = "shardstream[train]"


class MissingDependency(RuntimeError):
    """A package the configured run needs is not installed; the message is one line."""


@dataclass(frozen=True)
class Requirement:
    module: str  # what is imported
    package: str  # what pip installs
    needed_for: str
    off_switch: str = ""  # the setting that does without it ("" : nothing does)
    instead: str = ""  # a setting that provides it another way ("": none)
    in_extra: bool = True  # installed by the shardstream[train] extra (else: by its own name only)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (cheap on every rank)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken __spec__
        return False


def requirements(cfg: Config | None) -> list[Requirement]:
    """What a run with ``cfg`` imports (None: what any run imports)."""
    needed = [
        Requirement("torch", "torch", "training"),
        Requirement("open_clip", "open_clip_torch", "the CLIP models and loss"),
        Requirement("yaml", "pyyaml", "config files"),
    ]
    if (
        cfg is not None
        and not cfg.model.tokenizer
        and installed("open_clip")
        and not installed("transformers")
    ):
        hf_name = _hf_tokenizer(cfg.model.name)
        if hf_name:
            needed.append(
                Requirement(
                    "transformers",
                    "transformers",
                    f"model.name {cfg.model.name} (its Hugging Face tokenizer {hf_name!r})",
                    instead="--model.tokenizer PATH (a local tokenizer.json or tokenizer folder)",
                )
            )
    if cfg is not None and cfg.log.tensorboard:
        needed.append(Requirement("tensorboard", "tensorboard", "log.tensorboard", "--log.tensorboard false"))
    if cfg is not None and cfg.log.wandb:
        needed.append(Requirement("wandb", "wandb", "log.wandb", "--log.wandb false", in_extra=False))
    if cfg is not None and cfg.log.progress == "on":
        needed.append(Requirement("tqdm", "tqdm", "log.progress on", "--log.progress auto"))
    return needed


def _hf_tokenizer(model_name: str) -> str | None:
    from shardstream.train.model import hf_tokenizer_name

    try:
        return hf_tokenizer_name(model_name)
    except Exception:  # an unknown model: create_model names it, with the known ones
        return None


def problems(cfg: Config | None) -> list[str]:
    """One line per missing package."""
    lines = []
    for req in requirements(cfg):
        if installed(req.module):
            continue
        fix = f"pip install '{EXTRA}' (or {req.package})" if req.in_extra else f"pip install {req.package}"
        if req.off_switch:
            fix += f", or turn it off: {req.off_switch}"
        if req.instead:
            fix += f", or set {req.instead}"
        lines.append(f"{req.needed_for} needs the {req.package} package, which is not installed: {fix}")
    return lines


def check(cfg: Config | None) -> None:
    """Raises ``MissingDependency`` (its message: one line per missing package)."""
    lines = problems(cfg)
    if lines:
        raise MissingDependency("\n".join(lines))


__all__ = ["EXTRA", "MissingDependency", "check", "installed", "problems", "requirements"]
