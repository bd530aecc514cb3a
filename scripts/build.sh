#!/usr/bin/env bash
# Installs missing packages, then configures and builds Depot (Release) in build/.
# Extra arguments are passed to CMake's configure step, e.g.
#   ./scripts/build.sh -DDEPOT_CUDA=OFF
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
