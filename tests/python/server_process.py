"""Real depot-server processes for the Python tests.

start_server() runs the binary on ephemeral loopback ports with --port_file
in a private temp dir, blocks (inotify on the dir and a pidfd on the child,
never a fixed sleep) until the port file appears, then waits on the server's
health service through the library under test. The child's output goes to a
log file whose text is attached to every error.
"""

import ctypes
import os
import pathlib
import select
import shutil
import signal
import subprocess
import tempfile
import time

import depot

_IN_CLOSE_WRITE = 0x08
_IN_MOVED_TO = 0x80
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """Popen preexec_fn: the child gets SIGKILL when the test process dies,
    so a killed test run leaves no server or worker behind."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerError(RuntimeError):
    pass


class ServerProcess:
    """A started depot-server; stop() (or the context manager) ends it."""

    def __init__(self, process, temp_dir, log_path, address):
        self.process = process
        self.address = address
        self._temp_dir = temp_dir
        self._log_path = log_path

    def log(self):
        return pathlib.Path(self._log_path).read_text(errors="replace")

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL if it has not exited within `timeout`.
        Returns the exit code (negative: the signal that ended it)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._temp_dir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _wait_for_file(path, pidfd, deadline):
    """Blocks until `path` exists; False if the process behind `pidfd`
    exits first. TimeoutError at `deadline` (time.monotonic())."""
    fd = _libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if _libc.inotify_add_watch(fd, str(path.parent).encode(),
                                   _IN_CLOSE_WRITE | _IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        while not path.exists():  # checked after arming the watch: no race
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{path} did not appear")
            ready, _, _ = select.select([fd, pidfd], [], [], remaining)
            if pidfd in ready:
                return path.exists()
            if fd in ready:
                os.read(fd, 65536)  # drain the events
        return True
    finally:
        os.close(fd)


def start_server(binary, extra_flags=(), timeout=60.0, client_options=None):
    """Starts `binary` and returns a ServerProcess once it is SERVING.
    `client_options`: depot.Client keyword arguments of the health check
    (tls_ca=... for a server with --tls_cert)."""
    temp_dir = tempfile.mkdtemp(prefix="depot-pytest-")
    port_file = pathlib.Path(temp_dir) / "port"
    log_path = os.path.join(temp_dir, "server.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", "--metrics_listen=",
             f"--port_file={port_file}", *extra_flags],
            stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent)
    server = ServerProcess(process, temp_dir, log_path, address=None)
    try:
        deadline = time.monotonic() + timeout
        pidfd = os.pidfd_open(process.pid)
        try:
            written = _wait_for_file(port_file, pidfd, deadline)
        finally:
            os.close(pidfd)
        if not written:
            raise ServerError(f"depot-server exited with "
                              f"{process.wait()} before serving")
        server.address = port_file.read_text().splitlines()[0].strip()
        with depot.Client([server.address],
                          **(client_options or {})) as client:
            client.wait_for_servers(max(deadline - time.monotonic(), 0.0))
        return server
    except Exception as e:
        log_text = server.log()
        server.stop()
        raise ServerError(f"{e}\n--- depot-server log ---\n{log_text}") from e
