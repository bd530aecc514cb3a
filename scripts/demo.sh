#!/usr/bin/env bash
# Builds Depot, starts two depot-server daemons on this machine, trains the example
# MLP with two data-parallel workers against them, prints where the metrics are and
# a summary scraped from them, then (when /usr/bin/python3 has torch) trains
# client/examples/train_torch.py with two workers against the same servers, and
# stops the servers with SIGTERM.
#
# Servers: A on 127.0.0.1:50051 (metrics 127.0.0.1:9464), B on 127.0.0.1:50052
# (metrics 127.0.0.1:9465); a server whose port is taken falls back to free ports.
# Exits with the trainers' status (non-zero too if a server does not exit cleanly
# or the PyTorch example fails).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${DEMO_STEPS:-30}"
SERVER_BIN=build/server/depot-server
TRAINER_BIN=build/client/examples/depot-train-mlp

./scripts/build.sh

workdir="$(mktemp -d "${TMPDIR:-/tmp}/depot-demo.XXXXXX")"
declare -A server_pid grpc_addr metrics_addr
trainer_pids=()

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local pid
  for pid in "${trainer_pids[@]}" "${server_pid[@]}"; do
    if kill -0 "${pid}" 2>/dev/null; then
      kill -TERM "${pid}" 2>/dev/null || true
      wait "${pid}" 2>/dev/null || true
    fi
  done
  rm -rf "${workdir}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME LISTEN METRICS_LISTEN: starts a server in the background and
# waits until it has written its port file (it does so once both ports are bound).
# Returns 1 if the server exits first, e.g. because a port is taken.
start_server() {
  local name="$1" listen="$2" metrics="$3"
  local port_file="${workdir}/${name}.port" log="${workdir}/${name}.log"
  rm -f "${port_file}"
  "${SERVER_BIN}" --listen="${listen}" --metrics_listen="${metrics}" \
    --port_file="${port_file}" >"${log}" 2>&1 &
  server_pid[${name}]=$!
  # The port file is written atomically (tmp file + rename), so once it exists it
  # is complete. Bounded wait: 300 x 0.1 s.
  local tries=0
  until [[ -s "${port_file}" ]]; do
    if ! kill -0 "${server_pid[${name}]}" 2>/dev/null; then
      wait "${server_pid[${name}]}" || true
      unset 'server_pid[${name}]'
      return 1
    fi
    if ((++tries > 300)); then
      echo "demo: server ${name} did not become ready; its log:" >&2
      cat "${log}" >&2
      exit 1
    fi
    sleep 0.1
  done
  grpc_addr[${name}]="$(sed -n 1p "${port_file}")"
  metrics_addr[${name}]="$(sed -n 2p "${port_file}")"
}

# start_server_or_fallback NAME PORT METRICS_PORT
start_server_or_fallback() {
  local name="$1" port="$2" metrics_port="$3"
  if start_server "${name}" "127.0.0.1:${port}" "127.0.0.1:${metrics_port}"; then
    return
  fi
  echo "demo: ports ${port}/${metrics_port} are not available, using free ports"
  if ! start_server "${name}" 127.0.0.1:0 127.0.0.1:0; then
    echo "demo: server ${name} failed to start; its log:" >&2
    cat "${workdir}/${name}.log" >&2
    exit 1
  fi
}

start_server_or_fallback A 50051 9464
start_server_or_fallback B 50052 9465
echo "demo: server A on ${grpc_addr[A]} (metrics http://${metrics_addr[A]}/metrics)"
echo "demo: server B on ${grpc_addr[B]} (metrics http://${metrics_addr[B]}/metrics)"

servers="${grpc_addr[A]},${grpc_addr[B]}"
for rank in 0 1; do
  "${TRAINER_BIN}" --servers="${servers}" --num_workers=2 --worker_rank="${rank}" \
    --steps="${STEPS}" > >(tee "${workdir}/worker${rank}.log") &
  trainer_pids+=($!)
done
trainer_status=0
for pid in "${trainer_pids[@]}"; do
  status=0
  wait "${pid}" || status=$?
  if ((status != 0 && trainer_status == 0)); then
    trainer_status=${status}
  fi
done
trainer_pids=()

# metric TEXT SERIES [mib]: the value of one series in a Prometheus text
# exposition, optionally shown in MiB.
metric() {
  awk -v series="$2" -v unit="${3:-}" '
    $1 == series { found = 1; value = $2 }
    END {
      if (!found) print "n/a"
      else if (unit == "mib") printf "%.1f MiB\n", value / 1048576
      else printf "%d\n", value
    }' <<<"$1"
}

echo
echo "Metrics (Prometheus text format):"
for name in A B; do
  echo "  server ${name}: http://${metrics_addr[${name}]}/metrics"
done
echo
printf '%-8s %16s %16s %20s %20s\n' server steps_completed chunks_updated \
  gradients_received weights_sent
for name in A B; do
  text="$(curl -fsS "http://${metrics_addr[${name}]}/metrics" || true)"
  printf '%-8s %16s %16s %20s %20s\n' "${name}" \
    "$(metric "${text}" depot_steps_completed_total)" \
    "$(metric "${text}" depot_chunks_updated_total)" \
    "$(metric "${text}" 'depot_received_bytes_total{rpc="step"}' mib)" \
    "$(metric "${text}" 'depot_sent_bytes_total{rpc="step"}' mib)"
done
echo

# The counters must account for exactly the work done: each of the W = 2 workers
# sent every gradient element once per step, and each server completed every step.
# And the exposition must be valid Prometheus text.
check_status=0
read -r elements elem_bytes < <(sed -n \
  's/^\[worker 0\] job .*: \([0-9]*\) elements, \([0-9]*\) gradient bytes each$/\1 \2/p' \
  "${workdir}/worker0.log")
expected_bytes=$((2 * elements * elem_bytes * STEPS))
received_bytes=0
for name in A B; do
  text="$(curl -fsS "http://${metrics_addr[${name}]}/metrics")"
  if command -v promtool >/dev/null; then
    if ! promtool check metrics <<<"${text}"; then
      echo "demo: server ${name}'s metrics fail promtool check metrics" >&2
      check_status=1
    fi
  fi
  steps_done="$(metric "${text}" depot_steps_completed_total)"
  if [[ "${steps_done}" != "${STEPS}" ]]; then
    echo "demo: server ${name} completed ${steps_done} steps, expected ${STEPS}" >&2
    check_status=1
  fi
  received_bytes=$((received_bytes + $(metric "${text}" 'depot_received_bytes_total{rpc="step"}')))
done
if ((received_bytes == expected_bytes)); then
  echo "demo: metrics consistent: gradient bytes received = 2 workers x ${elements} x ${elem_bytes} B x ${STEPS} steps = ${received_bytes}; promtool check metrics passed"
else
  echo "demo: gradient bytes received ${received_bytes}, expected ${expected_bytes}" >&2
  check_status=1
fi
echo

# The PyTorch example runs after the metrics check, which counts the C++ job's
# gradient bytes only: its own job would add to the servers' counters.
torch_status=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "demo: training client/examples/train_torch.py (DepotOptimizer) with 2 workers"
  for rank in 0 1; do
    /usr/bin/python3 client/examples/train_torch.py --servers="${servers}" \
      --num_workers=2 --worker_rank="${rank}" --steps="${STEPS}" \
      --job_name=demo-torch >"${workdir}/torch${rank}.log" 2>&1 &
    trainer_pids+=($!)
  done
  for pid in "${trainer_pids[@]}"; do
    status=0
    wait "${pid}" || status=$?
    if ((status != 0 && torch_status == 0)); then
      torch_status=${status}
    fi
  done
  trainer_pids=()
  # Shown after the run: two processes writing to one pipe interleave lines.
  cat "${workdir}/torch0.log" "${workdir}/torch1.log"
  echo
else
  echo "demo: /usr/bin/python3 cannot import torch; skipping the PyTorch example"
fi

server_status=0
for name in A B; do
  kill -TERM "${server_pid[${name}]}"
  status=0
  wait "${server_pid[${name}]}" || status=$?
  unset 'server_pid[${name}]'
  if ((status != 0)); then
    echo "demo: server ${name} exited with status ${status}; its log:" >&2
    cat "${workdir}/${name}.log" >&2
    server_status=1
  fi
done
echo "demo: servers stopped"

if ((trainer_status != 0)); then
  echo "demo: a trainer failed (status ${trainer_status})" >&2
  exit "${trainer_status}"
fi
if ((server_status != 0)); then
  exit "${server_status}"
fi
if ((torch_status != 0)); then
  echo "demo: the PyTorch example failed (status ${torch_status})" >&2
  exit "${torch_status}"
fi
exit "${check_status}"
