#!/usr/bin/python3
"""Trains a small PyTorch network with depot.torch.DepotOptimizer: AdamW runs
on the Depot servers, the model and its forward and backward stay here.

    build/server/depot-server --listen=127.0.0.1:50051 --metrics_listen= &
    build/server/depot-server --listen=127.0.0.1:50052 --metrics_listen= &
    client/examples/train_torch.py --worker_rank=0 &
    client/examples/train_torch.py --worker_rank=1

The task is regression onto a fixed random "teacher" network of the same
shape, with fresh inputs every step (each worker draws its own), so the loss
must fall. Each worker prints "[worker R] step S loss L step_seconds T
depot_seconds D (servers' update U, B MB)" (D: the time step() took, the
trainer's wait on Depot; DepotOptimizer.last_step) and
exits non-zero if the loss did not fall. The package is used from the source
tree unless `depot` is installed; the library from DEPOT_CLIENT_LIBRARY or
build/client/ (client/python/depot/_loader.py).
"""

import argparse
import math
import pathlib
import sys
import time

import torch

try:
    import depot  # installed with pip install client/python
except ImportError:  # run from the source tree
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] /
                           "python"))
    import depot
from depot.torch import DepotOptimizer  # noqa: E402

WIDTHS = (64, 256, 256, 8)
WARMUP_STEPS = 5
TEACHER_SEED_SALT = 0x7EAC4E7
DATA_SEED_SALT = 0xDA7A


def parse_args():
    parser = argparse.ArgumentParser(
        description="Trains a small network with Depot as the optimizer. Run "
        "one process per worker (--worker_rank 0 .. --num_workers - 1) "
        "against the same --servers.")
    parser.add_argument(
        "--servers", default="127.0.0.1:50051,127.0.0.1:50052",
        help="comma-separated host:port of the depot-server processes, in "
        "the same order for every worker")
    parser.add_argument("--num_workers", type=int, default=2,
                        help="data-parallel workers taking part")
    parser.add_argument("--worker_rank", type=int, default=0,
                        help="this worker's rank, 0 .. num_workers - 1")
    parser.add_argument("--steps", type=int, default=30,
                        help="training steps to run")
    parser.add_argument("--batch_size", type=int, default=32,
                        help="samples per step on this worker")
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="peak AdamW learning rate (warmup, then cosine)")
    parser.add_argument(
        "--job_name", default="demo-torch",
        help="Depot job name; every worker of the run uses the same one, and "
        "a new run on the same servers needs a new one")
    parser.add_argument(
        "--seed", type=int, default=1,
        help="seed of the initial weights and the teacher (the same for "
        "every worker); each worker's data also mixes in its rank")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch_size must be > 0")
    return args


def mlp(seed):
    torch.manual_seed(seed)
    layers = []
    for i, (width_in, width_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        if i > 0:
            layers.append(torch.nn.GELU())
        layers.append(torch.nn.Linear(width_in, width_out))
    return torch.nn.Sequential(*layers)


def warmup_cosine(total_steps):
    def factor(step):
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = (step - WARMUP_STEPS) / max(1, total_steps - WARMUP_STEPS)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def main():
    args = parse_args()
    rank, workers = args.worker_rank, args.num_workers
    model = mlp(args.seed)
    teacher = mlp(args.seed ^ TEACHER_SEED_SALT).requires_grad_(False)
    named = list(model.named_parameters())
    groups = [  # the usual split: no weight decay on biases
        {"params": [p for n, p in named if not n.endswith("bias")],
         "weight_decay": 0.01},
        {"params": [p for n, p in named if n.endswith("bias")],
         "weight_decay": 0.0},
    ]
    # The only Depot-specific lines: the optimizer and where it runs (this
    # process is the trainer's own, so it lets Depot tune malloc for the
    # transfers: opt-in, as it applies to the whole process).
    optimizer = DepotOptimizer(
        groups, servers=args.servers.split(","), job_name=args.job_name,
        optimizer="adamw", lr=args.lr, num_workers=workers,
        worker_rank=rank, chunk_elems=1 << 14,
        retain_transport_buffers=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                 warmup_cosine(args.steps))
    print(f"[worker {rank}] job {args.job_name}: "
          f"{sum(p.numel() for p in model.parameters())} parameters",
          flush=True)

    data = torch.Generator().manual_seed(
        args.seed ^ (DATA_SEED_SALT * (rank + 1)))
    first_loss = loss = None
    for step in range(1, args.steps + 1):
        start = time.monotonic()
        inputs = torch.randn(args.batch_size, WIDTHS[0], generator=data)
        loss = torch.nn.functional.mse_loss(model(inputs), teacher(inputs))
        optimizer.zero_grad()
        # Depot sums the workers' gradients: dividing each worker's mean loss
        # by W trains on the mean over the global batch.
        (loss / workers).backward()
        optimizer.step()
        schedule.step()
        first_loss = loss.item() if first_loss is None else first_loss
        cost = optimizer.last_step
        print(f"[worker {rank}] step {step} loss {loss.item():.6f} "
              f"step_seconds {time.monotonic() - start:.4f} "
              f"depot_seconds {cost.exposed_seconds:.4f} "
              f"(servers' update {cost.server_update_seconds:.4f}, "
              f"{(cost.bytes_sent + cost.bytes_received) / 1e6:.2f} MB)",
              flush=True)
    print(f"[worker {rank}] final loss {loss.item():.6f} "
          f"(first {first_loss:.6f})")
    if not loss.item() < first_loss:
        print(f"[worker {rank}] the loss did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except depot.DepotError as e:  # carries the server's message
        print(f"train_torch.py: {e}", file=sys.stderr)
        sys.exit(1)
