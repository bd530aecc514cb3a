"""Fixtures of the Python package's tests: the package from the source tree,
the built library and real depot-server processes.

Environment (set by tests/python/CMakeLists.txt for ctest):
  DEPOT_CLIENT_LIBRARY  the built libdepot_client.so (else the package's own
                        search: build/client/ of the source tree, ...)
  DEPOT_SERVER          the built depot-server (else build/server/depot-server)
"""

import os
import pathlib
import sys
import uuid

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parents[1]
PACKAGE_DIR = REPO_ROOT / "client" / "python"

# The tests use the package from the source tree, not an installed copy.
sys.path.insert(0, str(PACKAGE_DIR))
sys.path.insert(0, str(TESTS_DIR))

import server_process  # noqa: E402  (needs the package on sys.path)


def server_binary():
    binary = os.environ.get("DEPOT_SERVER") or str(
        REPO_ROOT / "build" / "server" / "depot-server")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"depot-server not found at {binary}: build it and set "
                    f"DEPOT_SERVER to its path", pytrace=False)
    return binary


@pytest.fixture(scope="session")
def servers():
    """Addresses of two depot-server processes shared by the session's tests
    (each test uses its own job names)."""
    binary = server_binary()
    started = []
    try:
        for _ in range(2):
            started.append(server_process.start_server(
                binary, ["--threads=2"]))
        yield [s.address for s in started]
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def job_name(request):
    """A job name no other test (or earlier run on the same servers) uses."""
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def client(servers):
    import depot
    with depot.Client(servers) as c:
        yield c
