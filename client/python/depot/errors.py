"""Exceptions for the status codes of libdepot_client.

Every failed call raises a subclass of DepotError chosen by its status code
(the absl / gRPC canonical codes, docs/protocol.md), carrying the message the
library or the server gave, e.g.::

    try:
        job.step(7, grads, weights)
    except depot.AbortedError as e:   # step out of order
        print(e.code_name, e.message)

Each subclass also derives from the built-in exception that Python code
already catches for the same kind of failure, so that generic handlers work
without knowing Depot:

==========================  ======================================
InvalidArgumentError        ValueError
OutOfRangeError             IndexError: an index of the job's flat
                            space [0, N), or a chunk, outside it
NotFoundError               LookupError
AlreadyExistsError          (none besides DepotError)
DeadlineExceededError       TimeoutError
PermissionDeniedError       PermissionError
UnauthenticatedError        PermissionError
UnavailableError            ConnectionError
UnimplementedError          NotImplementedError
FailedPreconditionError     RuntimeError
AbortedError                RuntimeError
ResourceExhaustedError      RuntimeError (not MemoryError, which
                            means this process ran out of memory;
                            this is a server's budget)
CancelledError,             (none besides DepotError)
UnknownError, InternalError,
DataLossError
==========================  ======================================

``except depot.DepotError`` still catches them all.
"""

from typing import Dict, List, Type


class DepotError(Exception):
    """A libdepot_client call failed. `code` is the status code number,
    `code_name` its name ("NOT_FOUND"), `message` the library's or the
    server's message."""

    code: int = 2
    code_name: str = "UNKNOWN"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"


class CancelledError(DepotError):
    """The call was cancelled."""
    code, code_name = 1, "CANCELLED"


class UnknownError(DepotError):
    """An error without a better code."""
    code, code_name = 2, "UNKNOWN"


class InvalidArgumentError(DepotError, ValueError):
    """Malformed input: a bad config, option or buffer."""
    code, code_name = 3, "INVALID_ARGUMENT"


class DeadlineExceededError(DepotError, TimeoutError):
    """A deadline passed, e.g. a peer worker too slow."""
    code, code_name = 4, "DEADLINE_EXCEEDED"


class NotFoundError(DepotError, LookupError):
    """Unknown job (deleted, or the server restarted)."""
    code, code_name = 5, "NOT_FOUND"


class AlreadyExistsError(DepotError):
    """Already exists."""
    code, code_name = 6, "ALREADY_EXISTS"


class PermissionDeniedError(DepotError, PermissionError):
    """Permission denied."""
    code, code_name = 7, "PERMISSION_DENIED"


class ResourceExhaustedError(DepotError, RuntimeError):
    """A server's memory budget would be exceeded."""
    code, code_name = 8, "RESOURCE_EXHAUSTED"


class FailedPreconditionError(DepotError, RuntimeError):
    """Config or layout mismatch, or init after a step."""
    code, code_name = 9, "FAILED_PRECONDITION"


class AbortedError(DepotError, RuntimeError):
    """A stale or out-of-order step."""
    code, code_name = 10, "ABORTED"


class OutOfRangeError(DepotError, IndexError):
    """A range outside the job or the shard."""
    code, code_name = 11, "OUT_OF_RANGE"


class UnimplementedError(DepotError, NotImplementedError):
    """Not implemented."""
    code, code_name = 12, "UNIMPLEMENTED"


class InternalError(DepotError):
    """A broken invariant, or a server that broke the protocol."""
    code, code_name = 13, "INTERNAL"


class UnavailableError(DepotError, ConnectionError):
    """A server is down or shutting down."""
    code, code_name = 14, "UNAVAILABLE"


class DataLossError(DepotError):
    """Corrupt data."""
    code, code_name = 15, "DATA_LOSS"


class UnauthenticatedError(DepotError, PermissionError):
    """Bad credentials."""
    code, code_name = 16, "UNAUTHENTICATED"


_BY_CODE: Dict[int, Type[DepotError]] = {
    cls.code: cls for cls in DepotError.__subclasses__()}


class RolledBackError(AbortedError):
    """The job was rolled back under the call: a server restarted behind the
    others (killed and restored from its checkpoints) and the library rolled
    every server back to `step`, the newest step all of them could return to
    (docs/checkpoints.md, "Rolling back"). Reload the trainer's data position
    for `step` and go on with step `step` + 1; DepotOptimizer has already put
    the weights of `step` into the parameters."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def error_for_code(code: int, message: str) -> DepotError:
    """The DepotError subclass instance for status code `code`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        error = DepotError(message)
        error.code = code
        error.code_name = f"CODE_{code}"
        return error
    return cls(message)


__all__: List[str] = ["DepotError", "RolledBackError", "error_for_code"] + \
    sorted(cls.__name__ for cls in _BY_CODE.values())
