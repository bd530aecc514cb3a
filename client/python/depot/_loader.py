"""Finds and loads libdepot_client, the C library this package wraps.

Where it looks, in order (the first that exists wins):

1. the file named by the environment variable ``DEPOT_CLIENT_LIBRARY``
   (when set, it is the only place tried);
2. ``libdepot_client.so`` next to this package (inside the ``depot`` folder);
3. the source tree's build, ``build/client/libdepot_client.so`` relative to
   the repository this package sits in (``client/python/depot``);
4. the system loader (``LD_LIBRARY_PATH``, ``ldconfig``'s cache), by the
   SONAME ``libdepot_client.so.0`` that an installed library always has,
   then by the development link ``libdepot_client.so``.
"""

import ctypes
import os
import pathlib
from typing import List, Mapping, Optional, Union

LIBRARY_ENV = "DEPOT_CLIENT_LIBRARY"
LIBRARY_FILE = "libdepot_client.so"
# The SONAME; its number changes with the library's ABI (docs/packaging.md).
LIBRARY_SONAME = "libdepot_client.so.0"


class LibraryNotFoundError(OSError):
    """libdepot_client could not be found or loaded."""


def candidate_paths() -> List[pathlib.Path]:
    """The files tried before the system loader, in order."""
    package_dir = pathlib.Path(__file__).resolve().parent
    paths = [package_dir / LIBRARY_FILE]
    repo_root = package_dir.parents[2]
    # Only when the package is the source tree's client/python/depot, not an
    # installed copy.
    if (repo_root / "client" / "include" / "depot" / "depot.h").is_file():
        paths.append(repo_root / "build" / "client" / LIBRARY_FILE)
    return paths


def _load(path: Union[str, pathlib.Path]) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFoundError(
            f"cannot load libdepot_client from {path}: {e}") from e


def load_library(
        environ: Optional[Mapping[str, str]] = None) -> ctypes.CDLL:
    """Returns the loaded library as a ctypes.CDLL.

    Raises LibraryNotFoundError saying where it looked and how to point at
    the library.
    """
    environ = os.environ if environ is None else environ
    explicit = environ.get(LIBRARY_ENV)
    if explicit:
        if not os.path.isfile(explicit):
            raise LibraryNotFoundError(
                f"{LIBRARY_ENV}={explicit} does not name a file: point it at "
                f"the built {LIBRARY_FILE} (e.g. build/client/{LIBRARY_FILE})")
        return _load(explicit)
    tried = candidate_paths()
    for path in tried:
        if path.is_file():
            return _load(path)
    for name in (LIBRARY_SONAME, LIBRARY_FILE):
        try:
            return ctypes.CDLL(name)  # dlopen's own search
        except OSError:
            pass
    places = ", ".join(str(p) for p in tried)
    raise LibraryNotFoundError(
        f"{LIBRARY_FILE} not found (looked in {places} and the system "
        f"loader's paths for {LIBRARY_SONAME} and {LIBRARY_FILE}). Install "
        f"it (docs/packaging.md) or build it (./scripts/build.sh builds "
        f"build/client/{LIBRARY_FILE}) and set {LIBRARY_ENV} to its path, "
        f"or copy it next to the depot package")
