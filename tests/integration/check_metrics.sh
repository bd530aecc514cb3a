#!/usr/bin/env bash
# Usage: check_metrics.sh PATH/TO/depot-server
# Starts a depot-server on free loopback ports, scrapes its /metrics and runs
# `promtool check metrics` on the exposition, then stops the server with SIGTERM and
# checks that it exits 0. Exit 77 (CTest: skipped) when promtool or curl is missing.
set -euo pipefail

server_bin="$1"
for tool in promtool curl; do
  if ! command -v "${tool}" >/dev/null; then
    echo "SKIP: ${tool} is not installed (./scripts/setup.sh installs it)"
    exit 77
  fi
done

workdir="$(mktemp -d "${TMPDIR:-/tmp}/depot-check-metrics.XXXXXX")"
server_pid=""
cleanup() {
  if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -KILL "${server_pid}" 2>/dev/null || true
    wait "${server_pid}" 2>/dev/null || true
  fi
  rm -rf "${workdir}"
}
trap cleanup EXIT

"${server_bin}" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --port_file="${workdir}/port" >"${workdir}/server.log" 2>&1 &
server_pid=$!

# The port file is renamed into place once both ports are bound. Bounded wait on
# that condition: 300 x 0.1 s.
for ((tries = 0; ; ++tries)); do
  [[ -s "${workdir}/port" ]] && break
  if ! kill -0 "${server_pid}" 2>/dev/null || ((tries >= 300)); then
    echo "FAIL: depot-server did not write its port file; its output:"
    cat "${workdir}/server.log"
    exit 1
  fi
  sleep 0.1
done
metrics_addr="$(sed -n 2p "${workdir}/port")"
if [[ -z "${metrics_addr}" ]]; then
  echo "FAIL: the port file has no metrics address (line 2)"
  exit 1
fi

curl -fsS "http://${metrics_addr}/metrics" >"${workdir}/metrics.txt"
if ! promtool check metrics <"${workdir}/metrics.txt"; then
  echo "FAIL: promtool check metrics rejected http://${metrics_addr}/metrics:"
  cat "${workdir}/metrics.txt"
  exit 1
fi
echo "promtool check metrics: OK ($(grep -c '^# TYPE' "${workdir}/metrics.txt") metric families)"

kill -TERM "${server_pid}"
status=0
wait "${server_pid}" || status=$?
server_pid=""
if ((status != 0)); then
  echo "FAIL: depot-server exited with status ${status} after SIGTERM; its output:"
  cat "${workdir}/server.log"
  exit 1
fi
