#!/usr/bin/python3
"""Every panel of the Grafana dashboard (deploy/grafana/depot-servers.json)
returns data from a real Prometheus scraping real servers during training.

Starts two depot-server processes (metrics on, checkpoints every few steps),
Debian's Prometheus with deploy/prometheus/prometheus.yml (its depot job's
targets replaced by those servers, a 1 s scrape interval, the deploy rules
loaded), trains a DepotOptimizer job against the servers in a background
thread, and asks Prometheus every panel query (Grafana's variables replaced:
$instance by ".*", $__rate_interval by 20s, $__range by 5m) until each
returns at least one series; the steps panel must also show steps completing
(a value above zero). Fails naming each panel whose query stays empty, or
whose PromQL Prometheus rejects.

Environment: DEPOT_SERVER (the depot-server binary), DEPOT_CLIENT_LIBRARY.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import torch  # noqa: E402

import depot  # noqa: E402
import server_process  # noqa: E402
from depot.torch import DepotOptimizer  # noqa: E402

DASHBOARD = REPO / "deploy" / "grafana" / "depot-servers.json"
SUBSTITUTIONS = {"$instance": ".*", "$__rate_interval": "20s",
                 "$__range": "5m"}
DEADLINE_SECONDS = 90


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_address(server):
    lines = (pathlib.Path(server._temp_dir) / "port").read_text().split()
    return lines[1]


def prometheus_config(targets, directory):
    config = yaml.safe_load(
        (REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [
        str(REPO / "deploy" / "prometheus" / "depot_rules.yml")]
    jobs = [j for j in config["scrape_configs"] if j["job_name"] == "depot"]
    assert jobs, "deploy/prometheus/prometheus.yml has no depot job"
    jobs[0]["static_configs"] = [{"targets": targets}]
    jobs[0].pop("file_sd_configs", None)
    path = pathlib.Path(directory) / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
    except urllib.error.HTTPError as error:
        body = json.load(error)
    if body.get("status") != "success":
        raise ValueError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def train(client, stop):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 64)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=f"grafana-{os.getpid()}", lr=1e-3,
                         chunk_elems=4096)
    while not stop.is_set():
        opt.zero_grad()
        model(torch.randn(8, 256)).square().mean().backward()
        opt.step()
        time.sleep(0.02)
    opt.job.delete()
    opt.close()


def main():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in SUBSTITUTIONS.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: {expr} keeps a variable"
            queries.append((panel["title"], target["refId"], expr))
    with tempfile.TemporaryDirectory() as tmp:
        servers = []
        prometheus = None
        stop = threading.Event()
        trainer = None
        try:
            for s in range(2):
                servers.append(server_process.start_server(
                    os.environ["DEPOT_SERVER"],
                    ["--metrics_listen=127.0.0.1:0", "--threads=1",
                     f"--checkpoint_dir={tmp}/server-{s}",
                     "--checkpoint_every_steps=20"]))
            targets = [metrics_address(s) for s in servers]
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={prometheus_config(targets, tmp)}",
                 f"--storage.tsdb.path={tmp}/tsdb",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/prom.log", "w"))
            client = depot.Client([s.address for s in servers])
            client.wait_for_servers(30)
            trainer = threading.Thread(target=train, args=(client, stop))
            trainer.start()
            deadline = time.monotonic() + DEADLINE_SECONDS
            pending = list(queries)
            rejected = []
            steps_seen = False
            while (pending or not steps_seen) and \
                    time.monotonic() < deadline:
                time.sleep(1)
                try:
                    query(base, "up")
                except OSError:
                    continue  # Prometheus not up yet
                still = []
                for title, ref, expr in pending:
                    try:
                        result = query(base, expr)
                    except ValueError as error:
                        rejected.append(f"{title} ({ref}): {error}")
                        continue
                    if not result:
                        still.append((title, ref, expr))
                pending = still
                steps = query(base, 'sum(rate(depot_steps_completed_total'
                                    '{job="depot"}[20s]))')
                steps_seen = bool(steps) and float(steps[0]["value"][1]) > 0
            for line in rejected:
                print(f"FAIL: Prometheus rejected {line}")
            for title, ref, expr in pending:
                print(f"FAIL: no data for panel {title!r} ({ref}): {expr}")
            if not steps_seen:
                print("FAIL: no steps completing in the steps panel's data")
            if rejected or pending or not steps_seen:
                print(open(f"{tmp}/prom.log").read()[-2000:])
                sys.exit(1)
            print(f"ok: {len(queries)} queries of {len(panels)} panels "
                  f"return data from Prometheus scraping 2 servers")
        finally:
            stop.set()
            if trainer is not None:
                trainer.join()
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
