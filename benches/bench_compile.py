"""torch.compile's speed-up on the trainer's step, side by side in one run.

The CPU demo model (shardstream-tiny, 64 px, batch 64 by default) trains a few warm-up steps and
then ``--steps`` timed steps eagerly and compiled (``train.compile``: ``torch.compile`` over the
model, the trainer's exact-accumulation backward and fused AdamW), in alternating rounds so that
the machine's load falls on both alike. Prints the compile time, each round's step times and the
median ratio. The loss of the same batches must agree between the two (a compiled model that
computed something else would not be faster, only wrong).

    python benches/bench_compile.py [--model shardstream-tiny] [--batch 64] [--accum 1] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from shardstream.train.loss import contrastive_backward, make_loss, resolve_loss_kind
from shardstream.train.model import create_model, param_groups


def make_trainer(name: str, compiled: bool):
    torch.manual_seed(0)
    bundle = create_model(name, pretrained="", device=torch.device("cpu"))
    model = torch.compile(bundle.model) if compiled else bundle.model
    optimizer = torch.optim.AdamW(param_groups(bundle.model, 0.1), lr=1e-4, fused=True)
    loss_fn = make_loss(resolve_loss_kind("auto", bundle.model, name), 0, 1)
    return bundle, model, optimizer, loss_fn


def step(model, optimizer, loss_fn, micro) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = contrastive_backward(
        model, loss_fn, micro, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    )
    optimizer.step()
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="shardstream-tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    eager = make_trainer(args.model, False)
    compiled = make_trainer(args.model, True)
    bundle = eager[0]
    generator = torch.Generator().manual_seed(1)
    size = bundle.image_size
    images = torch.randint(
        0, 256, (args.batch * args.accum, 3, size, size), dtype=torch.uint8, generator=generator
    )
    x = bundle.normalise(images, torch.device("cpu"))
    t = bundle.tokenizer([f"a photo of object {i}" for i in range(args.batch * args.accum)])
    micro = [
        (x[i * args.batch : (i + 1) * args.batch], t[i * args.batch : (i + 1) * args.batch])
        for i in range(args.accum)
    ]

    start = time.perf_counter()
    first = step(*compiled[1:], micro)  # compiles (forward without and with a graph, backward)
    second = step(*compiled[1:], micro)
    compile_s = time.perf_counter() - start
    eager_losses = [step(*eager[1:], micro) for _ in range(2)]
    print(f"compile (first two steps): {compile_s:.1f} s")
    print(
        f"first two losses: eager {eager_losses[0]:.5f} {eager_losses[1]:.5f}, "
        f"compiled {first:.5f} {second:.5f}"
    )

    ratios = []
    for r in range(args.rounds):
        times = {}
        for label, (_, model, optimizer, loss_fn) in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            for _ in range(args.steps):
                step(model, optimizer, loss_fn, micro)
            times[label] = (time.perf_counter() - start) / args.steps
        ratios.append(times["eager"] / times["compiled"])
        print(
            f"round {r + 1}: eager {times['eager'] * 1e3:.0f} ms/step, "
            f"compiled {times['compiled'] * 1e3:.0f} ms/step, speed-up {ratios[-1]:.2f}x"
        )
    print(
        f"{args.model}, batch {args.batch} x accum {args.accum}, {torch.get_num_threads()} threads: "
        f"compile speed-up {statistics.median(ratios):.2f}x (median of {args.rounds} rounds; "
        f"range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
