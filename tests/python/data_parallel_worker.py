"""One worker of the data-parallel test (test_data_parallel.py): trains the
shared model with DepotOptimizer on its part of every batch and saves its
weights after every step.

    data_parallel_worker.py --servers=A,B --job_name=J --num_workers=2
                            --worker_rank=R --optimizer=adamw --out=W.npy
"""

import argparse

import numpy as np
import torch

import training
from depot.torch import DepotOptimizer


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--job_name", required=True)
    parser.add_argument("--num_workers", type=int, required=True)
    parser.add_argument("--worker_rank", type=int, required=True)
    parser.add_argument("--optimizer", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    trajectory = train(args.servers.split(","), args.job_name,
                       args.num_workers, args.worker_rank, args.optimizer)
    np.save(args.out, trajectory)


def hparams(optimizer):
    if optimizer == "sgd":
        return dict(lr=0.05, momentum=0.9, weight_decay=1e-3)
    return dict(lr=1e-2, weight_decay=0.1)


def train(servers, job_name, num_workers, worker_rank, optimizer,
          client=None):
    """Trains training.STEPS steps on rows [rank * B/W, (rank + 1) * B/W) of
    each batch. Returns the weights after every step, one row per step."""
    model = training.make_model()
    opt = DepotOptimizer(
        training.param_groups(model, hparams(optimizer)["weight_decay"]),
        servers, client=client, job_name=job_name, optimizer=optimizer,
        num_workers=num_workers, worker_rank=worker_rank,
        chunk_elems=training.CHUNK_ELEMS, **hparams(optimizer))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, training.lr_lambda)
    rows = training.BATCH_SIZE // num_workers
    mine = slice(worker_rank * rows, (worker_rank + 1) * rows)
    trajectory = []
    for step in range(training.STEPS):
        inputs, targets = training.batch(step)
        # The servers sum the W gradients: dividing each local mean loss by
        # W makes the sum the gradient of the mean over the whole batch.
        training.train_step(model, opt, inputs[mine], targets[mine],
                            loss_divisor=num_workers)
        schedule.step()
        trajectory.append(training.flat_weights(model).numpy())
    return np.stack(trajectory)


if __name__ == "__main__":
    main()
