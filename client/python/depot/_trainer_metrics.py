"""Opt-in Prometheus metrics of a trainer process (DepotOptimizer.
serve_metrics): each step's LastStep figures summed as counters, served as
Prometheus text at /metrics by a small HTTP server on a daemon thread. No
dependency beyond the standard library."""

import http.server
import math
import threading

_COUNTERS = (
    # (name, help, LastStep field or None for a count of steps)
    ("depot_trainer_steps_total", "Steps this trainer finished.", None),
    ("depot_trainer_exposed_seconds_total",
     "Host seconds the trainer spent in DepotOptimizer.step().",
     "exposed_seconds"),
    ("depot_trainer_wire_seconds_total",
     "Seconds of the steps' calls to the servers, start to weights back.",
     "wire_seconds"),
    ("depot_trainer_server_update_seconds_total",
     "The servers' CPU update seconds for this trainer's steps, summed over "
     "the servers.", "server_update_seconds"),
    ("depot_trainer_sent_bytes_total", "Gradient payload bytes sent.",
     "bytes_sent"),
    ("depot_trainer_received_bytes_total", "Weight payload bytes received.",
     "bytes_received"),
    ("depot_trainer_skipped_steps_total",
     "Steps the servers skipped (a NaN or Inf in the gradient).", "skipped"),
)
_GAUGES = (
    ("depot_trainer_step", "The last step this trainer finished.", "step"),
    ("depot_trainer_loss_scale", "The last step's loss scale.",
     "loss_scale"),
    ("depot_trainer_grad_norm",
     "The last step's unscaled gradient norm (0 unless measured).",
     "grad_norm"),
)


def _escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class TrainerMetrics:
    def __init__(self, address, job_name):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"serve_metrics: address {address!r} is not "
                             f"host:port")
        self._lock = threading.Lock()
        self._labels = f'{{job_name="{_escape(job_name)}"}}'
        self._counters = {name: 0.0 for name, _, _ in _COUNTERS}
        self._gauges = {name: 0.0 for name, _, _ in _GAUGES}
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type",
                                 "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # no line per scrape
                pass

        self._server = http.server.ThreadingHTTPServer(
            (host.strip("[]") or "127.0.0.1", int(port)), Handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        self.address = f"{bound_host}:{bound_port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="depot-trainer-metrics",
                                        daemon=True)
        self._thread.start()

    def record(self, step, last):
        with self._lock:
            for name, _, field in _COUNTERS:
                self._counters[name] += 1.0 if field is None else \
                    float(getattr(last, field))
            for name, _, field in _GAUGES:
                self._gauges[name] = float(step if field == "step"
                                           else getattr(last, field))

    def render(self):
        lines = []
        with self._lock:
            for kind, table, values in (("counter", _COUNTERS,
                                         self._counters),
                                        ("gauge", _GAUGES, self._gauges)):
                for name, text, _ in table:
                    value = values[name]
                    lines.append(f"# HELP {name} {text}")
                    lines.append(f"# TYPE {name} {kind}")
                    shown = repr(value) if math.isfinite(value) else \
                        ("NaN" if math.isnan(value) else
                         ("+Inf" if value > 0 else "-Inf"))
                    lines.append(f"{name}{self._labels} {shown}")
        return "\n".join(lines) + "\n"

    def close(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
