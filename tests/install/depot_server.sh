# shellcheck shell=bash
# Sourced by the install tests: a depot-server on a free loopback port.
#
# start_depot_server BINARY LOG starts BINARY with --listen=127.0.0.1:0 and
# blocks on its standard output (a read with a deadline, never a sleep) until
# it prints the address it listens on; the clients under test then wait on its
# health service themselves. Sets DEPOT_SERVER_ADDRESS and DEPOT_SERVER_PID.
# The server gets SIGKILL if the test dies first (setpriv --pdeathsig), and
# stop_depot_server ends it with SIGTERM and checks that it exits 0.

start_depot_server() {
  local binary=$1 log=$2 line
  exec {DEPOT_SERVER_OUTPUT}< <(exec setpriv --pdeathsig KILL -- "${binary}" \
    --listen=127.0.0.1:0 --metrics_listen= --threads=2 2>"${log}")
  DEPOT_SERVER_PID=$!
  # main.cc prints "depot-server listening on ADDRESS (...)" once serving.
  if ! IFS= read -r -t 60 -u "${DEPOT_SERVER_OUTPUT}" line; then
    echo "depot-server did not start; its log:" >&2
    cat "${log}" >&2
    return 1
  fi
  if [[ ! ${line} =~ listening\ on\ ([^ ]+) ]]; then
    echo "unexpected first line from depot-server: ${line}" >&2
    return 1
  fi
  # shellcheck disable=SC2034  # read by the scripts that source this one
  DEPOT_SERVER_ADDRESS=${BASH_REMATCH[1]}
}

stop_depot_server() {
  local status=0
  kill -TERM "${DEPOT_SERVER_PID}"
  wait "${DEPOT_SERVER_PID}" || status=$?
  exec {DEPOT_SERVER_OUTPUT}<&-
  if ((status != 0)); then
    echo "depot-server exited with status ${status}" >&2
    return 1
  fi
}
