#!/usr/bin/env bash
# The long chaos run of issue 12 (docs/checkpoints.md, "Rolling back"): 3 real
# depot-servers, 2 workers, a checkpoint every 10 steps; a random server is
# killed with SIGKILL at random steps and restarted, and the run must end
# bitwise equal to an uninterrupted one. CI runs the same test short (60 steps,
# 4 kills).
#
#   ./scripts/chaos.sh [STEPS [KILLS [SEED]]]     defaults: 200 10 <random>
#
# Builds first (./scripts/build.sh) unless build/ already has the test binary.
# Prints each kill, the rollbacks each worker saw and the most steps one kill
# cost; exits non-zero when the run diverged or failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

steps="${1:-200}"
kills="${2:-10}"
seed="${3:-$RANDOM}"
binary=build/tests/integration/depot_integration_tests
if [[ ! -x "$binary" ]]; then
  ./scripts/build.sh
fi
echo "chaos run: ${steps} steps, ${kills} kills, seed ${seed} (rerun with: $0 ${steps} ${kills} ${seed})"
DEPOT_CHAOS_STEPS="$steps" DEPOT_CHAOS_KILLS="$kills" DEPOT_CHAOS_SEED="$seed" \
  "$binary" --gtest_filter='RollBackTest.ChaosKillsEndBitwise'
