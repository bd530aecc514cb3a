// The status page (StatusEndpoint, /status): one HTML document with its
// styles and script inline, no external resource. The script polls
// /status.json every second, keeps the last ten minutes in memory, turns
// counters into rates and draws each series on a plain <canvas>. Each chart's
// element carries data-points (samples drawn), data-last (the newest value)
// and data-max (the largest in the window), which tests/deploy/status_page_test.py reads in headless Chromium.
#include "server/status_endpoint.h"

namespace depot {

const char kStatusPageHtml[] = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>depot-server status</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
  h1 { font-size: 20px; margin: 0 0 4px 0; }
  #summary { color: #555; margin-bottom: 12px; }
  #error { color: #b00; font-weight: bold; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
  .chart { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px; }
  .chart h2 { font-size: 13px; margin: 0 0 4px 0; font-weight: 600; }
  .chart .value { float: right; color: #555; font-weight: normal; }
  canvas { width: 100%; height: 140px; display: block; }
  table { border-collapse: collapse; margin-top: 16px; background: #fff; width: 100%; }
  th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; }
  th { background: #f0f0f0; }
  td.name, th.name { text-align: left; }
  .missing { color: #b00; font-weight: bold; }
  .note { color: #777; font-size: 12px; margin-top: 12px; }
</style>
</head>
<body>
<h1>depot-server <span id="listen"></span></h1>
<div id="summary">waiting for /status.json ...</div>
<div id="error"></div>
<div class="charts" id="charts"></div>
<table id="jobs">
  <thead><tr><th class="name">job</th><th>id</th><th>server</th><th>step</th>
  <th>workers</th><th>waiting on</th><th>waiting s</th><th>shard params</th>
  <th>state</th></tr></thead>
  <tbody></tbody>
</table>
<div class="note">Charts: the last ten minutes, one sample a second, kept by this page
(reload starts again). Loss scale and grad norm live in the trainers
(DepotOptimizer.last_step, serve_metrics). Fleet-wide history: Prometheus and the
Grafana dashboard in deploy/grafana.</div>
<script>
"use strict";
const WINDOW_SECONDS = 600;
const CHARTS = [
  {id: "steps", title: "Steps completed / s", unit: ""},
  {id: "chunks", title: "Update throughput (chunk updates / s)", unit: ""},
  {id: "bytes_in", title: "Bytes in (MB/s)", unit: " MB/s"},
  {id: "bytes_out", title: "Bytes out (MB/s)", unit: " MB/s"},
  {id: "latency", title: "Mean step latency (ms)", unit: " ms"},
  {id: "memory", title: "Memory budget in use, %", unit: " %"},
  {id: "streams", title: "Active step streams", unit: ""},
  {id: "stalled", title: "Stalled steps", unit: ""},
  {id: "checkpoint_age", title: "Checkpoint age (s)", unit: " s"},
];
const series = {};
for (const c of CHARTS) {
  series[c.id] = [];
  const div = document.createElement("div");
  div.className = "chart";
  div.id = "chart-" + c.id;
  div.dataset.points = "0";
  div.innerHTML = "<h2>" + c.title + "<span class=\"value\"></span></h2><canvas></canvas>";
  document.getElementById("charts").appendChild(div);
}
let previous = null;
let startTime = null;
let restarts = 0;

function push(id, t, v) {
  if (v === null || !isFinite(v)) return;
  const s = series[id];
  s.push([t, v]);
  while (s.length && s[0][0] < t - WINDOW_SECONDS) s.shift();
}

function draw(c) {
  const div = document.getElementById("chart-" + c.id);
  const canvas = div.querySelector("canvas");
  const s = series[c.id];
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio; canvas.height = h * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, h);
  div.dataset.points = String(s.length);
  if (!s.length) return;
  const last = s[s.length - 1];
  div.dataset.last = String(last[1]);
  div.querySelector(".value").textContent =
      (Math.abs(last[1]) >= 100 ? last[1].toFixed(0) : last[1].toPrecision(3)) + c.unit;
  // From the first sample kept (at most ten minutes back) to the newest.
  const t1 = last[0], t0 = Math.max(s[0][0], t1 - WINDOW_SECONDS);
  const span = Math.max(t1 - t0, 1);
  let top = 0;
  for (const p of s) top = Math.max(top, p[1]);
  div.dataset.max = String(top);
  top = top > 0 ? top * 1.1 : 1;
  g.strokeStyle = "#eee"; g.lineWidth = 1;
  for (let i = 1; i < 4; i++) {
    g.beginPath(); g.moveTo(0, h * i / 4); g.lineTo(w, h * i / 4); g.stroke();
  }
  g.fillStyle = "#999"; g.font = "10px system-ui";
  g.fillText(top.toPrecision(3), 2, 10);
  g.fillText(Math.round(span) + " s", w - 40, h - 2);
  g.strokeStyle = "#1f6feb"; g.lineWidth = 1.5;
  g.beginPath();
  s.forEach((p, i) => {
    const x = (p[0] - t0) / span * w;
    const y = h - p[1] / top * (h - 4);
    if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
  });
  g.stroke();
  if (s.length === 1) {
    g.fillStyle = "#1f6feb";
    g.fillRect(w - 4, h - s[0][1] / top * (h - 4) - 2, 4, 4);
  }
}

function human(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return bytes.toFixed(i ? 1 : 0) + " " + units[i];
}

function update(status) {
  const t = status.time;
  const server = status.server;
  if (startTime !== null && server.start_time !== startTime) restarts++;
  startTime = server.start_time;
  document.getElementById("listen").textContent = server.listen;
  const age = server.checkpoint_last_success > 0 ? t - server.checkpoint_last_success : null;
  document.getElementById("summary").textContent =
      status.jobs.length + " job(s), state " + human(server.state_bytes) + ", budget in use " +
      human(server.memory_used_bytes) + " of " + human(server.memory_limit_bytes) + ", " + server.threads + " update threads, up " +
      Math.round(t - server.start_time) + " s" + (restarts ? " (" + restarts + " restart(s) seen)" : "") +
      (server.checkpoint_dir ? ", checkpoints in " + server.checkpoint_dir +
        (age === null ? " (none written yet)" : " (last " + Math.round(age) + " s ago)") : ", no checkpoints");
  if (previous !== null && t > previous.time) {
    const dt = t - previous.time, c = status.counters, p = previous.counters;
    push("steps", t, (c.steps_completed - p.steps_completed) / dt);
    push("chunks", t, (c.chunks_updated - p.chunks_updated) / dt);
    push("bytes_in", t, (c.received_bytes - p.received_bytes) / dt / 1e6);
    push("bytes_out", t, (c.sent_bytes - p.sent_bytes) / dt / 1e6);
    const n = status.step_seconds.count - previous.step_seconds.count;
    push("latency", t, n > 0 ? (status.step_seconds.sum - previous.step_seconds.sum) / n * 1e3 : 0);
  }
  push("memory", t, server.memory_limit_bytes > 0 ? 100 * server.memory_used_bytes / server.memory_limit_bytes : 0);
  push("streams", t, status.gauges.active_streams);
  push("stalled", t, status.gauges.stalled_steps);
  if (age !== null) push("checkpoint_age", t, age);
  previous = status;
  for (const c of CHARTS) draw(c);
  const body = document.querySelector("#jobs tbody");
  body.innerHTML = "";
  for (const j of status.jobs) {
    const row = document.createElement("tr");
    const missing = j.missing_workers.length
        ? "<span class=\"missing\">" + j.missing_workers.join(", ") + "</span>" : "";
    // Job names are per tenant: a tenant's job shows as "tenant / name".
    const name = j.tenant ? j.tenant + " / " + j.name : j.name;
    const cells = [name, j.id, (j.server_index + 1) + " of " + j.num_servers,
      j.step + (j.newest_step !== j.step ? " (" + j.newest_step + " in part)" : ""),
      (j.num_workers - j.missing_workers.length) + " of " + j.num_workers,
      missing, j.pending_step ? j.waiting_seconds.toFixed(1) : "",
      j.shard_params, human(j.state_bytes)];
    cells.forEach((v, i) => {
      const td = document.createElement("td");
      if (i === 0) { td.className = "name"; td.textContent = v; } else td.innerHTML = String(v);
      row.appendChild(td);
    });
    body.appendChild(row);
  }
}

async function poll() {
  try {
    const reply = await fetch("/status.json", {cache: "no-store"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    update(await reply.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot read /status.json: " + e.message;
  }
}
poll();
setInterval(poll, 1000);
</script>
</body>
</html>
)html";

}  // namespace depot
