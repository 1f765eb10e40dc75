"""A step's inputs, prepared one step ahead: loader batches -> tokens and normalised images on the device.

The trainer asks for step n's inputs (``take``), issues step n's model work, then prepares step
n+1's (``stage``) while the device is busy with step n:

* tokens: ``batch.tokens`` when the loader tokenized the captions (``ShardLoader(tokenizer=...)``,
  ``int64 [B, context_length]``), else the model's tokenizer on ``batch.texts``, here;
* images: uint8 ``[B, 3, S, S]`` to the device, then normalised there (only uint8 crosses PCIe).

On CUDA the copies and the normalisation run on a side stream from pinned memory, so step n+1's
transfer overlaps step n's compute; ``take`` makes the compute stream wait for the side stream
(``wait_stream``, no host wait) and hands the tensors over with ``record_stream``, so the caching
allocator does not reuse their memory while the compute stream still reads them. On the CPU there
is nothing to overlap: the same code runs inline (the "device" is the process itself).

Every second spent here is input time: the trainer reports it, with the loader wait and the
tokenization apart, as the step's ``input_wait_frac``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class StepInputs:
    """One optimizer step's micro-batches, on the device, and what preparing them cost the host."""

    micro: list[tuple[Tensor, Tensor]]  # (normalised images, tokens) per micro-batch
    batches: list[Any]  # the loader's batches (their keys, texts)
    loader_wait_s: float = 0.0  # in next(loader)
    tokenize_s: float = 0.0  # tokenizing captions here (0 when the loader sent tokens)
    prepare_s: float = 0.0  # everything else: pinning, issuing the copies, normalising

    @property
    def host_s(self) -> float:
        return self.loader_wait_s + self.tokenize_s + self.prepare_s


@dataclass
class InputPipeline:
    """Prepares each step's ``accum`` micro-batches from a batch iterator, one step ahead.

    ``normalise(images_on_device) -> float images`` and ``tokenizer(texts) -> int64 tokens`` come
    from the model; ``context_length`` checks tokens that the loader made."""

    device: torch.device
    accum: int
    normalise: Callable[[Tensor], Tensor]
    tokenizer: Callable[[list[str]], Tensor]
    context_length: int | None = None
    _batches: Iterator[Any] | None = field(default=None, init=False, repr=False)
    _staged: StepInputs | None = field(default=None, init=False, repr=False)
    _exhausted: bool = field(default=False, init=False, repr=False)
    _stream: Any = field(default=None, init=False, repr=False)
    #: host seconds spent so far, by kind (a step's share: the difference across it)
    totals: dict[str, float] = field(
        default_factory=lambda: {"loader_wait_s": 0.0, "tokenize_s": 0.0, "prepare_s": 0.0}, init=False
    )

    def __post_init__(self) -> None:
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(device=self.device)
            # the side stream reads what the compute stream made before (normalisation constants)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))

    def start(self, batches: Iterator[Any]) -> None:
        """Reads from ``batches`` (a new epoch's iterator); anything staged before is dropped."""
        self._batches = batches
        self._staged = None
        self._exhausted = False

    def take(self) -> StepInputs | None:
        """This step's inputs, usable on the current stream (prepared now if none was staged);
        None when the iterator ended before a whole step."""
        if self._staged is None and not self._exhausted:
            self.stage()
        inputs, self._staged = self._staged, None
        if inputs is None:
            return None
        if self._stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._stream)  # device-side ordering: the host does not wait
            for images, tokens in inputs.micro:
                images.record_stream(current)  # made on the side stream, read on this one
                tokens.record_stream(current)
        return inputs

    def stage(self) -> None:
        """Fetches and prepares the next step's micro-batches (its copies issued, not waited for)."""
        if self._staged is not None or self._exhausted:
            return
        assert self._batches is not None, "InputPipeline.start() first"
        inputs = StepInputs(micro=[], batches=[])
        for _ in range(self.accum):
            t = time.perf_counter()
            try:
                batch = next(self._batches)
            except StopIteration:
                self._exhausted = True
                return
            inputs.loader_wait_s += time.perf_counter() - t
            self.totals["loader_wait_s"] += time.perf_counter() - t
            inputs.batches.append(batch)
            tokenize, prepare = inputs.tokenize_s, inputs.prepare_s
            inputs.micro.append(self._prepare(batch, inputs))
            self.totals["tokenize_s"] += inputs.tokenize_s - tokenize
            self.totals["prepare_s"] += inputs.prepare_s - prepare
        self._staged = inputs

    def _tokens(self, batch: Any, inputs: StepInputs) -> Tensor:
        tokens = getattr(batch, "tokens", None)
        if tokens is None:
            t = time.perf_counter()
            tokens = self.tokenizer(list(batch.texts))
            inputs.tokenize_s += time.perf_counter() - t
        elif self.context_length is not None and tokens.shape[-1] != self.context_length:
            raise ValueError(
                f"the loader's tokens have context length {tokens.shape[-1]}, the model expects "
                f"{self.context_length}: give the loader the model's tokenizer"
            )
        return tokens

    def _prepare(self, batch: Any, inputs: StepInputs) -> tuple[Tensor, Tensor]:
        tokens = self._tokens(batch, inputs)
        t = time.perf_counter()
        images = batch.images
        if self._stream is None:  # CPU (or another device without streams here): inline
            out = self.normalise(images.to(self.device)), tokens.to(self.device)
        else:
            if not images.is_pinned():  # the loader pins its buffers when CUDA is present
                images = images.pin_memory()
            if not tokens.is_pinned():
                tokens = tokens.pin_memory()
            with torch.cuda.stream(self._stream):
                gpu_images = images.to(self.device, non_blocking=True)
                gpu_tokens = tokens.to(self.device, non_blocking=True)
                out = self.normalise(gpu_images), gpu_tokens
            # A pinned buffer freed before its copy ran is safe: the caching host allocator
            # records the copy's stream and reuses the block only after the copy completed.
        inputs.prepare_s += time.perf_counter() - t
        return out


__all__ = ["InputPipeline", "StepInputs"]
