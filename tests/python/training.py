"""The model, data and schedule that the PyTorch tests train, shared by the
tests and the data-parallel worker processes so that every run sees the
same numbers."""

import copy

import torch

INPUT_WIDTH = 8
HIDDEN_WIDTH = 32
OUTPUT_WIDTH = 4
BATCH_SIZE = 16
STEPS = 50
# Small chunks spread even this small model over both servers and several
# pipelined chunks.
CHUNK_ELEMS = 64


def make_model(seed=0):
    """A small MLP with the same initial weights for every caller."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUT_WIDTH, HIDDEN_WIDTH), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN_WIDTH, OUTPUT_WIDTH))


def twin(model):
    """An independent copy with identical weights."""
    return copy.deepcopy(model)


def param_groups(model, weight_decay):
    """Two groups, as trainers usually have: weights decay, biases do not."""
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n.endswith("weight")],
         "weight_decay": weight_decay},
        {"params": [p for n, p in named if n.endswith("bias")],
         "weight_decay": 0.0},
    ]


def lr_lambda(step):
    """Warmup over 10 steps, then exponential decay."""
    return min(1.0, (step + 1) / 10) * 0.95 ** max(0, step - 10)


def batch(step):
    """Step `step`'s (inputs, targets), the same in every process."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH_SIZE, INPUT_WIDTH, generator=generator)
    targets = torch.sin(inputs[:, :OUTPUT_WIDTH] * 2.0) + 0.1 * torch.randn(
        BATCH_SIZE, OUTPUT_WIDTH, generator=generator)
    return inputs, targets


def train_step(model, optimizer, inputs, targets, loss_divisor=1.0):
    """One step on the mean squared error of (inputs, targets), divided by
    `loss_divisor` (the number of data-parallel workers, which Depot sums).
    Returns the undivided loss."""
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    (loss / loss_divisor).backward()
    optimizer.step()
    return loss.item()


def flat_weights(model):
    """Every parameter, flattened into one float64 tensor."""
    return torch.cat([p.detach().reshape(-1).double()
                      for p in model.parameters()])
