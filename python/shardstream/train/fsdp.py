"""``dist.strategy: fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) and its sharded
checkpoints (``torch.distributed.checkpoint``, DCP).

Wrapping: every transformer block of both towers (open_clip's ``visual.transformer.resblocks``,
``transformer.resblocks`` or ``text.transformer.resblocks``; CoCa's ``text_decoder`` blocks too)
gets its own ``fully_shard``, then the root, which holds the rest (embeddings, projections, the
logit scale and bias). Mixed precision follows ``model.precision``: bf16 (autocast) gathers the
parameters in bfloat16 and reduces gradients in fp32; fp32 casts nothing; pure_bf16 keeps its
bfloat16 weights as they are.

A sharded checkpoint is the folder ``checkpoints/step-00000100.dcp/``: each rank writes its own
shards there (DCP's ``FileSystemWriter``, ``__R_0.distcp``), rank 0 adds DCP's ``.metadata`` and
``trainer.pt``: the scheduler, every rank's RNG states, the loader state, the position in the
run and the config, the same entries as a ``.pt`` checkpoint without the weights, read back with
``torch.load(weights_only=True)``. The folder is written as ``step-N.dcp.tmp`` and renamed once
complete; then ``latest`` records its name, step and the sha256 of its manifest (see
``checkpoint.folder_sha256``), so that every rank checks it holds the same bytes before resuming,
as for a file. A checkpoint written on W ranks loads on W' (DCP reshards by parameter name).

In an ``s3://`` store each rank writes its files into a staging folder of its own (under
``output_dir/.checkpoint-staging``) and uploads them under ``prefix/step-N.dcp/``; once every
rank's upload is done (agreed in one all-gather, which also carries each rank's manifest lines)
rank 0 publishes ``latest`` with the whole folder's manifest hash, the same one a local folder
would give. A resume downloads the folder into an empty local one on every rank, verifies it
and loads it. The write is synchronous, whatever ``checkpoint.async_write`` says: ``latest`` may
only be published once every rank's upload is known to be done, which needs a collective, and
the background writer is one thread on rank 0 that no collective may wait on.

Trust: DCP's ``.metadata`` is a pickle that torch 2.15 reads with ``pickle.load``. Before torch
reads it, ``check_metadata`` replays it with an unpickler that only resolves DCP's own metadata
classes, torch sizes, dtypes and layouts and pathlib paths, so a folder whose metadata names any
other callable is refused instead of run. The shard files themselves torch reads with
``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from shardstream._files import AtomicFile, atomic_write
from shardstream.train import checkpoint as ckpt
from shardstream.train.checkpoint_async import CheckpointWriteError
from shardstream.train.config import ConfigError
from shardstream.train.dist import DistContext, all_gather_json, barrier, broadcast_json
from shardstream.train.storage import CheckpointStore, S3Store

SUFFIX = ".dcp"
TRAINER = "trainer.pt"  # rank 0's part: everything but the model and optimizer tensors


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}{SUFFIX}"


def is_sharded(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_dir()


# -- wrapping -------------------------------------------------------------------------------------


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks that get a ``fully_shard`` of their own (one all-gather each, freed after use)."""
    towers = [
        getattr(getattr(model, "visual", None), "transformer", None),
        getattr(model, "transformer", None),
        getattr(getattr(model, "text", None), "transformer", None),  # CustomTextCLIP, CoCa's text tower
        getattr(model, "text_decoder", None),  # CoCa: its blocks and cross-attention blocks
    ]
    blocks: list[torch.nn.Module] = []
    for tower in towers:
        for attr in ("resblocks", "cross_attn"):
            layers = getattr(tower, attr, None)
            if isinstance(layers, torch.nn.ModuleList):
                blocks.extend(layers)
    return blocks


def mixed_precision(precision: str) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":  # open_clip's amp_bf16: bf16 compute, fp32 gradient reduction
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "pure_bf16":  # the weights are bfloat16 already
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    if precision == "fp32":
        return MixedPrecisionPolicy()
    raise ConfigError(f"dist.strategy: fsdp does not support model.precision {precision!r}")


def shard(model: torch.nn.Module, ctx: DistContext, precision: str) -> torch.nn.Module:
    """``fully_shard`` on each transformer block, then on the root, over all ranks (in place:
    the returned module is ``model``, now an FSDP module with DTensor parameters)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not ctx.distributed:
        raise ConfigError("dist.strategy: fsdp needs a process group; start the run with torchrun")
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = mixed_precision(precision)
    vectorise_scalars(model)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def vectorise_scalars(model: torch.nn.Module) -> None:
    """0-dim parameters (open_clip's ``logit_scale`` and ``logit_bias``) as 1-element vectors:
    fully_shard refuses scalars ("Change logit_scale to a 1D tensor with numel equal to 1"), and
    a [1] tensor broadcasts in the losses exactly as the scalar does. ``export`` turns them back."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.ndim == 0:
                vector = torch.nn.Parameter(param.detach().reshape(1), requires_grad=param.requires_grad)
                setattr(module, name, vector)


def is_fsdp(model: torch.nn.Module) -> bool:
    """A module fully_shard has wrapped (FSDP2 swaps its class for one with this switch)."""
    return hasattr(model, "set_requires_gradient_sync")


@contextmanager
def no_gradient_sync(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2's ``no_sync``: gradients accumulate unsharded on each rank, and the next pass with
    sync on reduce-scatters their sum (what one pass over all micro-batches would give)."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective: every rank calls it), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


# -- checkpoints ----------------------------------------------------------------------------------


def save_sharded(
    directory: str | os.PathLike[str] | CheckpointStore,
    *,
    ctx: DistContext,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: ckpt.TrainingState,
    config: dict[str, Any],
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path | str | None:
    """Writes ``step-N.dcp/`` into the checkpoint store (a collective: every rank writes its
    shards), synchronously. Returns, on rank 0, its path (a local store) or URL; None elsewhere.
    A failed upload raises :class:`CheckpointWriteError` on every rank, and ``latest`` stays."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    store = ckpt.as_store(directory)
    name = checkpoint_name(state.step)
    rng = ckpt.gather_rng_states(ctx)
    payload = None
    if ctx.is_main:
        payload = {
            **ckpt.run_entries(ctx, state, config, rng),
            "sharded": True,
            "scheduler": scheduler.state_dict(),
            **(extra or {}),
        }
    folder = store.local_path("")
    if folder is not None:
        final = folder / name
        _write_in_place(final, ctx, get_state_dict(model, optimizer), payload)
        if not ctx.is_main:
            return None
        identity = ckpt.CheckpointIdentity(name, state.step, ckpt.folder_sha256(final), in_directory=True)
        atomic_write(folder / ckpt.POINTER, identity.pointer_line(), fsync=True)
        ckpt._prune(store, keep, protect=name)
        return final
    assert isinstance(store, S3Store)
    _upload_shards(store, name, ctx, get_state_dict(model, optimizer), payload, state.step, keep)
    return store.describe(name) if ctx.is_main else None


def _dcp_save(states: tuple[Any, Any], path: Path, ctx: DistContext) -> None:
    import torch.distributed.checkpoint as dcp

    model_state, optim_state = states
    with _single_process_expected():
        dcp.save(
            {"model": model_state, "optim": optim_state},
            storage_writer=dcp.FileSystemWriter(str(path), sync_files=True),
            no_dist=not ctx.distributed,  # one process: no group to coordinate through
        )


def _write_in_place(final: Path, ctx: DistContext, states: tuple[Any, Any], payload: Any) -> None:
    """A local store: every rank writes its shards into ``step-N.dcp.tmp`` in the one folder all
    ranks see, rank 0 adds ``trainer.pt`` and renames it whole."""
    partial = final.with_name(final.name + ".tmp")
    if ctx.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while writing
        partial.mkdir()
    barrier(ctx)
    _dcp_save(states, partial, ctx)
    barrier(ctx)  # every rank's shards are on disk
    if payload is not None:
        with AtomicFile(partial / TRAINER, fsync=True) as f:
            torch.save(payload, f.file)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)


def _upload_shards(
    store: S3Store,
    name: str,
    ctx: DistContext,
    states: tuple[Any, Any],
    payload: Any,
    step: int,
    keep: int,
) -> None:
    """A remote store: each rank writes its shards (rank 0 also DCP's ``.metadata`` and
    ``trainer.pt``) into a staging folder of its own and uploads them under ``step-N.dcp/``.
    One all-gather then gives every rank every rank's outcome and manifest lines: on any failure
    every rank raises the same error; otherwise rank 0 publishes ``latest`` (the objects are all
    there by then) with the hash of the whole folder's manifest, as a local folder would give,
    and prunes, and its outcome is broadcast too."""
    staging = store.staging / f"rank-{ctx.rank}"
    local = staging / name
    shutil.rmtree(staging, ignore_errors=True)  # left by a run killed while uploading
    local.mkdir(parents=True)
    error = None
    lines: list[str] = []
    try:
        # DCP's own collectives run inside: every rank gets here, whatever happens after
        _dcp_save(states, local, ctx)
        if payload is not None:
            torch.save(payload, local / TRAINER)
        lines = ckpt.manifest_lines(local)
        store.upload_dir(local, name)
    except Exception as e:  # noqa: BLE001 - every rank must reach the agreement below
        error = _one_line(e)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    where = store.describe(name)
    outcomes = all_gather_json(ctx, {"error": error, "manifest": lines})
    failed = [(rank, o["error"]) for rank, o in enumerate(outcomes) if o["error"]]
    if failed:
        if ctx.is_main:  # the ranks that did upload left a partial folder: not a checkpoint
            with contextlib.suppress(Exception):
                store.delete(name)
        rank, first = failed[0]
        raise CheckpointWriteError(f"checkpoint {where}: write failed on rank {rank}: {first}")
    published = None
    if ctx.is_main:
        manifest = [line for o in outcomes for line in o["manifest"]]
        identity = ckpt.CheckpointIdentity(name, step, ckpt.manifest_sha256(manifest), in_directory=True)
        try:
            store.put_bytes(ckpt.POINTER, identity.pointer_line())
            ckpt._prune(store, keep, protect=name)
        except Exception as e:  # noqa: BLE001 - raised on every rank, after the broadcast
            published = f"checkpoint {where}: write failed: {_one_line(e)}"
    published = broadcast_json(ctx, published)
    if published:
        raise CheckpointWriteError(published)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


@contextmanager
def _single_process_expected() -> Iterator[None]:
    """DCP without a process group warns that it assumes one process: here that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"torch\.distributed is .*single process", category=UserWarning
        )
        yield


def load_trainer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``trainer.pt`` of a sharded checkpoint (the same entries as a ``.pt`` one, no weights)."""
    path = Path(path)
    if not (path / TRAINER).is_file():
        raise ValueError(f"{path} is not a shardstream sharded checkpoint (no {TRAINER} in it)")
    return ckpt.load_checkpoint(path / TRAINER)


def load_sharded(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Loads the model and optimizer state of ``step-N.dcp/`` into ``model`` (FSDP or not, on any
    number of ranks: a collective where there is a process group) and returns ``trainer.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    payload = load_trainer_state(path)
    check_metadata(path)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    no_dist = not torch.distributed.is_initialized()  # one process, no group: read it all here
    with _single_process_expected():
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), no_dist=no_dist)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return payload


def load_model_weights(path: str | os.PathLike[str], template: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The model weights of ``step-N.dcp/`` in one process, no process group: ``template`` (a
    freshly built model's state dict) says which tensors, with their shapes, to read."""
    import torch.distributed.checkpoint as dcp

    check_metadata(path)
    # the scalars were saved as 1-element vectors (vectorise_scalars): read them so, return scalars
    state = {"model": {k: v.reshape(1) if v.ndim == 0 else v for k, v in template.items()}}
    with _single_process_expected():
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    return {k: v.reshape(()) if template[k].ndim == 0 else v for k, v in state["model"].items()}


# What DCP's .metadata may name: its own records, torch's sizes, dtypes and layouts, a path.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": None,  # any class of that module
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size", "strided", "sparse_coo", "contiguous_format", "channels_last", "preserve_format"}
    | {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _Refused(pickle.UnpicklingError):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_GLOBALS.get(module, set())
        if module not in _METADATA_GLOBALS or (allowed is not None and name not in allowed):
            raise _Refused(f"{module}.{name}")
        return super().find_class(module, name)


def check_metadata(path: str | os.PathLike[str]) -> None:
    """Refuses a DCP folder whose ``.metadata`` pickle names anything but DCP's metadata types
    (torch would run it: it reads the file with plain ``pickle.load``)."""
    metadata = Path(path) / ".metadata"
    try:
        data = metadata.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read DCP metadata: {e.strerror or e}") from None
    try:
        _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise ValueError(f"{metadata}: refused, it names {e}, not a DCP metadata type") from None
    except Exception as e:  # a torn or foreign file: EOFError, ValueError, ...
        raise ValueError(f"{metadata}: not DCP metadata ({type(e).__name__}: {e})") from None
