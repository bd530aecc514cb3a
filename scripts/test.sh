#!/usr/bin/env bash
# Builds Depot (see build.sh; arguments are passed to CMake) and runs every test:
# unit tests, integration tests against real depot-server processes, and the
# `promtool check metrics` check of a live server's /metrics (all through CTest).
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j2
