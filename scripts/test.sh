#!/usr/bin/env bash
# Builds Depot (see build.sh; arguments are passed to CMake) and runs every test:
# unit tests, integration tests against real depot-server processes, and the
# `promtool check metrics` check of a live server's /metrics (all through CTest).
# Exits non-zero on any failure. A test that fails is run once more and counts
# as failed only if it fails again; the log keeps both runs. This guards the
# landing of a change against a rare failure to reach a just-started server
# (seen once in about a dozen full runs on 2026-11-24, "failed to connect to
# all addresses", not reproduced since), which is being investigated.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j2 --repeat until-pass:2
