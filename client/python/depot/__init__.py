"""Depot from Python: a pure-Python package over libdepot_client's C API.

    import depot
    client = depot.Client(["127.0.0.1:50051"])
    job = client.open_job("run", [("w", 1024, 0)], lr=1e-3)

depot.torch.DepotOptimizer is a torch.optim.Optimizer that runs the step on
Depot servers (importing it needs torch; this module does not).

The library is found through DEPOT_CLIENT_LIBRARY, next to this package, in
the source tree's build/ or by the system loader (depot._loader).
"""

from depot._loader import LibraryNotFoundError
from depot.buffers import DType
from depot.client import (Client, FlatState, GroupHyperParams, Job,
                          ServerStatus, StepCommit, StepResult, TensorSpec,
                          optimizer_defaults)
from depot.engine import Engine
from depot.grad_scaler import GradScaler
from depot.errors import *  # noqa: F401,F403 (DepotError and its subclasses)
from depot import errors as _errors

__version__ = "0.1.0"

__all__ = [
    "Client", "DType", "Engine", "FlatState", "GradScaler", "GroupHyperParams", "Job", "LibraryNotFoundError",
    "ServerStatus", "StepCommit", "StepResult", "TensorSpec",
    "optimizer_defaults",
] + _errors.__all__
