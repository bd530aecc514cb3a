"""OwnedHandle: the life of a C API handle owned by a Python object."""

from typing import Any, TypeVar

from depot import _capi

_Self = TypeVar("_Self", bound="OwnedHandle")


class OwnedHandle:
    """Owns one C API handle, freed by close(), at the end of a `with`
    block, or when the object is collected.

    Subclasses set self._handle, name the C function that frees it in
    _DESTROY, and may override _describe() for the "is closed" error.
    """

    # The name of the depot.h function that frees the handle; each subclass
    # sets it.
    _DESTROY: str
    _handle: Any = None

    def _describe(self) -> str:
        return f"the {type(self).__name__}"

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            getattr(_capi.lib(), self._DESTROY)(handle)

    def _live_handle(self) -> Any:
        if not self._handle:
            raise ValueError(f"{self._describe()} is closed")
        return self._handle

    def __enter__(self: "_Self") -> "_Self":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
