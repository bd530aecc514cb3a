"""Exceptions for the status codes of libdepot_client.

Every failed call raises a subclass of DepotError chosen by its status code
(the absl / gRPC canonical codes, docs/protocol.md), carrying the message the
library or the server gave, e.g.::

    try:
        job.step(7, grads, weights)
    except depot.AbortedError as e:   # step out of order
        print(e.code_name, e.message)
"""


class DepotError(Exception):
    """A libdepot_client call failed. `code` is the status code number,
    `code_name` its name ("NOT_FOUND"), `message` the library's or the
    server's message."""

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return f"{self.code_name}: {self.message}"


def _error_class(code, code_name, doc):
    class_name = "".join(w.capitalize() for w in code_name.split("_"))
    return type(class_name + "Error", (DepotError,), {
        "code": code, "code_name": code_name, "__doc__": doc})


CancelledError = _error_class(1, "CANCELLED", "The call was cancelled.")
UnknownError = _error_class(2, "UNKNOWN", "An error without a better code.")
InvalidArgumentError = _error_class(
    3, "INVALID_ARGUMENT", "Malformed input: a bad config, option or buffer.")
DeadlineExceededError = _error_class(
    4, "DEADLINE_EXCEEDED", "A deadline passed, e.g. a peer worker too slow.")
NotFoundError = _error_class(
    5, "NOT_FOUND", "Unknown job (deleted, or the server restarted).")
AlreadyExistsError = _error_class(6, "ALREADY_EXISTS", "Already exists.")
PermissionDeniedError = _error_class(
    7, "PERMISSION_DENIED", "Permission denied.")
ResourceExhaustedError = _error_class(
    8, "RESOURCE_EXHAUSTED", "A server's memory budget would be exceeded.")
FailedPreconditionError = _error_class(
    9, "FAILED_PRECONDITION",
    "Config or layout mismatch, or init after a step.")
AbortedError = _error_class(10, "ABORTED", "A stale or out-of-order step.")
OutOfRangeError = _error_class(
    11, "OUT_OF_RANGE", "A range outside the job or the shard.")
UnimplementedError = _error_class(12, "UNIMPLEMENTED", "Not implemented.")
InternalError = _error_class(
    13, "INTERNAL", "A broken invariant, or a server that broke the protocol.")
UnavailableError = _error_class(
    14, "UNAVAILABLE", "A server is down or shutting down.")
DataLossError = _error_class(15, "DATA_LOSS", "Corrupt data.")
UnauthenticatedError = _error_class(
    16, "UNAUTHENTICATED", "Bad credentials.")

_BY_CODE = {cls.code: cls for cls in DepotError.__subclasses__()}


def error_for_code(code, message):
    """The DepotError subclass instance for status code `code`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        error = DepotError(message)
        error.code = code
        error.code_name = f"CODE_{code}"
        return error
    return cls(message)


__all__ = ["DepotError", "error_for_code"] + sorted(
    cls.__name__ for cls in _BY_CODE.values())
