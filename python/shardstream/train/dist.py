"""torch.distributed set-up from torchrun's environment, and the few collectives the trainer uses."""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from shardstream._system import env_int, launch_rank_world
from shardstream.train.config import ConfigError, DistConfig


class DistJoinError(RuntimeError):
    """Joining the process group failed or took longer than ``dist.join_timeout_s``."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: a single process without a process group
    # Host-side collectives (StopVote, broadcast_json) go through a gloo group: under nccl a flag
    # on the GPU would make the host wait for the device every step. None: the default group
    # (already gloo, or none).
    host_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def attempt_prefix(env: Mapping[str, str]) -> str:
    """The store prefix of this restart attempt, or "" where the store is new for every attempt.

    Under torchrun the workers share the elastic agent's TCP store (TORCHELASTIC_USE_AGENT_STORE).
    That store outlives a restart, and ``init_process_group`` alone puts the same keys into it on
    every attempt, so a restarted rank can read a dead rank's address left by the attempt before
    and dial it (connection refused, or a hang until the collective timeout). Keyed by the run id
    and the restart count, no key of an earlier attempt can be read. The restart count is the
    agent's; it is the same for every rank when one agent (one node) restarts them all."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return ""  # rank 0 hosts a fresh store (plain env:// launch, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    return f"shardstream/{run_id}/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


JOIN_GRACE_S = 10  # past dist.join_timeout_s, the watchdog ends a join that torch did not


def _watchdog(limit_s: float, line: str) -> threading.Timer:
    """Ends the process (exit code 1, one line on stderr) if not cancelled within ``limit_s``: a
    join blocked in C++ cannot be interrupted otherwise. Gloo retries a connection to an address
    that no longer answers several times over, each time for the whole timeout."""

    def expire() -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _join_process_group(backend: str, cfg: DistConfig, device: torch.device) -> Any:
    """``init_process_group`` from torchrun's environment, on this attempt's own keys, bounded by
    ``dist.join_timeout_s``: the store connection, every store read and the peers' connections
    time out after it (a watchdog ends the process if torch has not given up soon after), then
    the group gets the collective timeout ``dist.timeout_s``. Under nccl the host-side gloo group
    is made inside the same bound (its connections are where a wrong GLOO_SOCKET_IFNAME hangs);
    returned, or None."""
    rank, world_size = launch_rank_world()
    prefix = attempt_prefix(os.environ)
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    what = (
        f"joining the {backend} process group as rank {rank} of {world_size} "
        f"(store {address}{', keys ' + prefix if prefix else ''})"
    )
    join = datetime.timedelta(seconds=cfg.join_timeout_s)
    limit = cfg.join_timeout_s + JOIN_GRACE_S
    watchdog = _watchdog(
        limit,
        f"shardstream.train: error: {what} timed out after {limit} s (dist.join_timeout_s = "
        f"{cfg.join_timeout_s}, then {JOIN_GRACE_S} s for torch to give up); exiting",
    )
    start = time.monotonic()
    try:
        store, rank, world_size = next(rendezvous("env://", rank, world_size, timeout=join))
        store.set_timeout(join)
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(prefix, store) if prefix else store,
            rank=rank,
            world_size=world_size,
            timeout=join,
            device_id=device if backend == "nccl" else None,
        )
        if backend == "nccl":
            dist.barrier(device_ids=[device.index])
            # a collective (every rank creates it), once; host tensors only, no device involved
            host_group = dist.new_group(backend="gloo", timeout=join)
        else:
            dist.barrier()
            host_group = None
    except (RuntimeError, ValueError) as e:  # torch's DistError family subclasses RuntimeError
        elapsed = time.monotonic() - start
        verdict = "timed out" if elapsed >= 0.9 * cfg.join_timeout_s else "failed"
        cause = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        if dist.is_initialized():
            dist.destroy_process_group()
        raise DistJoinError(
            f"{what} {verdict} after {elapsed:.0f} s (dist.join_timeout_s = {cfg.join_timeout_s}): {cause}"
        ) from e
    finally:
        watchdog.cancel()
    collective = datetime.timedelta(seconds=cfg.timeout_s)
    store.set_timeout(collective)
    set_group_timeout(collective)
    if host_group is not None:
        set_group_timeout(collective, group=host_group)
    return host_group


def set_group_timeout(timeout: datetime.timedelta, group: dist.ProcessGroup | None = None) -> None:
    """Sets the collective timeout of a process group that already exists (the default group
    when ``group`` is None). ``torch.distributed.set_timeout`` is recent (mid-2026): torch
    releases before it, 2.11 among them, have only its private predecessor
    ``distributed_c10d._set_pg_timeout``, and the trainer must start on them too."""
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout, group)


def local_cuda_index(local_rank: int, device_count: int) -> int:
    """This process's CUDA device: ``LOCAL_RANK`` where it sees every GPU of its node, 0 where
    the launcher gave it one GPU of its own (CUDA_VISIBLE_DEVICES naming one device, as Slurm's
    --gpus-per-task and some schedulers do; ``cuda:LOCAL_RANK`` does not exist there)."""
    if device_count == 1:
        return 0
    if not 0 <= local_rank < device_count:
        raise ConfigError(
            f"LOCAL_RANK {local_rank} has no CUDA device: this process sees {device_count} "
            "(CUDA_VISIBLE_DEVICES); give each process one GPU, or all of the node's"
        )
    return local_rank


def init_distributed(cfg: DistConfig) -> DistContext:
    """Joins the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT or a c10d
    rendezvous), choosing nccl on CUDA GPUs and gloo on CPU unless the config says otherwise.
    Without torchrun's variables it is a single process with no process group. Joining is bounded
    by ``dist.join_timeout_s`` (``DistJoinError`` after it) and isolated per restart attempt."""
    cuda = torch.cuda.is_available()
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("dist.backend: nccl needs CUDA GPUs, and none is visible; use gloo or auto")
    local_rank = env_int("LOCAL_RANK", 0)
    device = (
        torch.device("cuda", local_cuda_index(local_rank, torch.cuda.device_count()))
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext(0, 1, 0, 1, device, None)
    if not dist.is_initialized():
        host_group = _join_process_group(backend, cfg, device)
    else:  # joined by the caller: its timeouts
        host_group = dist.new_group(backend="gloo") if backend == "nccl" else None
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=env_int("LOCAL_WORLD_SIZE", 1),
        device=device,
        backend=backend,
        host_group=host_group,
    )


def shutdown(ctx: DistContext, *, finished: bool) -> None:
    """Leaves the process group. ``finished``: every rank got here on the normal path, so they
    first wait for each other and leave together: rank 0 may still be writing the final
    checkpoint while the others are done, and a rank that exits then takes its end of the group
    away under a peer. After a failure there is no barrier: the other ranks may be gone or stuck.

    The group's gloo threads may outlive this call (see ``exit_process``)."""
    if not (ctx.distributed and dist.is_initialized()):
        return
    if finished:
        barrier(ctx)
    dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """Ends a torchrun worker whose run is complete, without finalizing the interpreter.

    DistributedDataParallel keeps its process group alive after ``destroy_process_group`` (the
    group's worker threads are still there when the script returns), so they run while the
    interpreter finalizes. A worker thread that then drops the last reference to a collective's
    tensor must take the GIL; during finalization Python ends such a thread with a forced unwind,
    which C++ turns into std::terminate: "terminate called without an active exception",
    SIGABRT, and torchrun reports the finished job as failed (exit status 1). Everything the run
    writes is closed by now; the standard streams are flushed here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def all_gather(ctx: DistContext, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor (same shape everywhere), on the CPU, in rank order."""
    if not ctx.distributed:
        return [tensor.cpu()]
    local = tensor.to(_comm_device(ctx)).contiguous()
    out = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    return [t.cpu() for t in out]


def all_gather_rows(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenates every rank's rows (counts may differ between ranks) in rank order."""
    if not ctx.distributed:
        return tensor.cpu()
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    counts = [int(c.item()) for c in all_gather(ctx, count)]
    padded = torch.zeros((max(counts), *tensor.shape[1:]), dtype=tensor.dtype)
    padded[: tensor.shape[0]] = tensor.cpu()
    parts = all_gather(ctx, padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)])


def mean_over_ranks(ctx: DistContext, value: torch.Tensor) -> float:
    """The mean of a scalar over all ranks (the global loss from each rank's local loss)."""
    if not ctx.distributed:
        return float(value.item())
    t = value.detach().to(_comm_device(ctx), torch.float64).reshape(1)
    dist.all_reduce(t)
    return float(t.item()) / ctx.world_size


def reduce_over_ranks(ctx: DistContext, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Element-wise sum or max of a small float64 vector over all ranks (on the CPU)."""
    if not ctx.distributed:
        return values.clone()
    t = values.to(_comm_device(ctx), torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.cpu()


def all_gather_json(ctx: DistContext, value: Any) -> list[Any]:
    """Every rank's ``value`` (plain JSON data), in rank order (a collective: all ranks call it).
    Two small all-gathers: the lengths, then the bytes padded to the longest."""
    if not ctx.distributed:
        return [value]
    data = json.dumps(value).encode()
    sizes = [int(t.item()) for t in all_gather(ctx, torch.tensor([len(data)], dtype=torch.int64))]
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # never empty: JSON
    parts = all_gather(ctx, padded)
    return [json.loads(bytes(part[:n].tolist()).decode()) for part, n in zip(parts, sizes, strict=True)]


def broadcast_json(ctx: DistContext, value: Any) -> Any:
    """Rank 0's ``value`` (plain JSON data) on every rank; what the other ranks pass is ignored.
    Through the host group: two small host-side broadcasts, the length then the bytes."""
    if not ctx.distributed:
        return value
    device = ctx.device if ctx.host_group is None and ctx.backend == "nccl" else torch.device("cpu")
    data = json.dumps(value).encode() if ctx.is_main else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0, group=ctx.host_group)
    buffer = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        if ctx.is_main
        else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    )
    dist.broadcast(buffer, src=0, group=ctx.host_group)
    return json.loads(bytes(buffer.cpu().tolist()).decode())


class StopVote:
    """Whether any rank asked to stop, agreed one step late so that no step waits for it.

    ``cast(flag)`` starts a host-side all-reduce (MAX) of this step's flag and returns the
    outcome of the previous cast, which has long finished by then: all ranks get the same answer
    at the same step without a blocking collective per step. A flag raised before step n's cast
    stops every rank after step n + 1. ``settle()`` waits for the cast in flight: call it on every
    rank before the next collective that must not overlap it, and before the process group goes."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._local = False  # without a process group: the previous flag itself

    def cast(self, flag: bool) -> bool:
        previous = self.settle()
        if not self.ctx.distributed:
            self._local = flag
            return previous
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        if self.ctx.host_group is None and self.ctx.backend == "nccl":
            t = t.to(self.ctx.device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctx.host_group, async_op=True)
        self._pending = (work, t)
        return previous

    def settle(self) -> bool:
        """The outcome of the last cast (False if none is pending); nothing is in flight after it."""
        if not self.ctx.distributed:
            previous, self._local = self._local, False
            return previous
        if self._pending is None:
            return False
        work, t = self._pending
        self._pending = None
        work.wait()
        return bool(t.item())


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True if the flag is set on any rank (so all ranks take the same branch). A host-side
    collective (gloo): it never waits for the device, so the trainer may call it every step."""
    if not ctx.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    if ctx.host_group is None and ctx.backend == "nccl":  # a context made without init_distributed
        t = t.to(ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.host_group)
    return bool(t.item())
