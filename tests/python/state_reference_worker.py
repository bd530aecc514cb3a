"""A trainer restarted in a new process (test_state_reference.py): it opens
the job by name, loads the optimizer's state dict from a torch.save file (a
reference to a server-side checkpoint), trains the steps after it and saves
the parameters.

    state_reference_worker.py --servers=A,B --job_name=J --checkpoint=C.pt
                              --last_step=N --out=P.pt
"""

import argparse

import torch

import depot
from depot.torch import DepotOptimizer

WIDTH = 1024  # a Linear(1024, 1024): 1,049,600 parameters
OPTIONS = dict(lr=1e-3, weight_decay=0.1, chunk_elems=1 << 18)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(WIDTH, WIDTH)


def batch(step):
    generator = torch.Generator().manual_seed(500 + step)
    return (torch.randn(4, WIDTH, generator=generator),
            torch.randn(4, WIDTH, generator=generator))


def train(model, opt, first, last):
    """Steps first..last, each on batch(step)."""
    for step in range(first, last + 1):
        inputs, targets = batch(step)
        opt.zero_grad()
        ((model(inputs) - targets) ** 2).mean().backward()
        opt.step()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--job_name", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--last_step", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    saved = torch.load(args.checkpoint)
    model = make_model(seed=7)  # other initial values than the saved run's
    with depot.Client(args.servers.split(",")) as client:
        opt = DepotOptimizer(model.parameters(), client=client,
                             job_name=args.job_name, **OPTIONS)
        opt.load_state_dict(saved["opt"])
        step = saved["opt"]["depot_step"]
        loaded = [p.detach().clone() for p in model.parameters()]
        train(model, opt, step + 1, args.last_step)
        opt.close()
    torch.save({"loaded": loaded,
                "final": [p.detach() for p in model.parameters()]}, args.out)


if __name__ == "__main__":
    main()
