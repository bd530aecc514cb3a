#!/usr/bin/python3
"""The status page every depot-server serves beside /metrics
(deploy/README.md, "Status page"), opened in Debian's headless Chromium
during a training run: its charts have data (each chart drew samples; steps,
update throughput and bytes in show work; the memory budget in use is above zero), the
jobs table lists the job at a step, and a screenshot is kept.

Usage: status_page_test.py SCREENSHOT_PATH
Environment: DEPOT_SERVER (the depot-server binary), DEPOT_CLIENT_LIBRARY.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import torch  # noqa: E402

import depot  # noqa: E402
import server_process  # noqa: E402
from depot.torch import DepotOptimizer  # noqa: E402

CHARTS = ["steps", "chunks", "bytes_in", "bytes_out", "latency", "memory",
          "streams", "stalled", "checkpoint_age"]
# Charts that must show work while a job trains.
BUSY = ["steps", "chunks", "bytes_in", "bytes_out", "memory"]


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("status_page_test: chromium is not installed "
             "(scripts/setup.sh installs Debian's chromium)")


def browse(url, flags, profile):
    # --virtual-time-budget lets the page's one-second polls run (each one
    # a real request) without waiting the seconds out.
    return subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
         "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1400,1300", "--virtual-time-budget=12000",
         *flags, url],
        capture_output=True, text=True, timeout=120)


def train(client, stop, steps):
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 128)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name="status-page", lr=1e-3, chunk_elems=8192)
    while not stop.is_set():
        opt.zero_grad()
        model(torch.randn(8, 512)).square().mean().backward()
        opt.step()
        steps[0] += 1
        time.sleep(0.005)
    opt.close()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    screenshot = pathlib.Path(sys.argv[1]).resolve()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = server_process.start_server(
            os.environ["DEPOT_SERVER"],
            ["--metrics_listen=127.0.0.1:0", "--threads=1",
             f"--checkpoint_dir={tmp}/ckpt", "--checkpoint_every_steps=10"])
        stop = threading.Event()
        steps = [0]
        trainer = None
        try:
            metrics = (pathlib.Path(server._temp_dir) / "port").read_text() \
                .split()[1]
            client = depot.Client([server.address])
            trainer = threading.Thread(target=train,
                                       args=(client, stop, steps))
            trainer.start()
            deadline = time.monotonic() + 60
            while steps[0] < 20:  # a checkpoint written, work under way
                assert time.monotonic() < deadline, "training did not start"
                time.sleep(0.05)
            url = f"http://{metrics}/status"
            dom = browse(url, ["--dump-dom"], f"{tmp}/profile-dom")
            assert dom.returncode == 0, dom.stderr[-2000:]
            shot = browse(url, [f"--screenshot={screenshot}"],
                          f"{tmp}/profile-shot")
            assert shot.returncode == 0, shot.stderr[-2000:]
        finally:
            stop.set()
            if trainer is not None:
                trainer.join()
            server.stop()
    html = dom.stdout
    failures = []
    for chart in CHARTS:
        match = re.search(rf'id="chart-{chart}"[^>]*', html)
        if match is None:
            failures.append(f"chart {chart} missing")
            continue
        attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', match.group(0)))
        points = int(attrs.get("points", 0))
        if points < 3:
            failures.append(f"chart {chart}: {points} samples drawn")
        if chart in BUSY and not float(attrs.get("max", 0)) > 0:
            failures.append(f"chart {chart}: no work shown ({attrs})")
        print(f"chart {chart}: {attrs}")
    rows = re.findall(r"<tr><td class=\"name\">status-page</td>(.*?)</tr>",
                      html)
    if not rows:
        failures.append("the jobs table does not list the job")
    else:
        cells = re.findall(r"<td>(.*?)</td>", rows[0])
        step = int(re.match(r"\d+", cells[2]).group(0))
        if step <= 0:
            failures.append(f"the job's step is {step}")
        print(f"jobs table: status-page {cells}")
    error = re.search(r'<div id="error">(.*?)</div>', html)
    if error is None or error.group(1).strip():
        failures.append(f"the page shows an error: "
                        f"{error.group(1) if error else 'no error element'}")
    if not screenshot.exists() or screenshot.stat().st_size < 10000:
        failures.append(f"no screenshot at {screenshot}")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        sys.exit(1)
    print(f"ok: the status page charts {len(CHARTS)} series during training; "
          f"screenshot {screenshot} ({screenshot.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
