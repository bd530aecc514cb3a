#!/usr/bin/env bash
# A CMake project outside the tree (downstream/) finds the installed package
# with find_package(depot CONFIG) through CMAKE_PREFIX_PATH, links
# depot::client, and trains one step against the installed depot-server with
# the installed library.
# Usage: check_downstream.sh SOURCE_DIR PREFIX WORK_DIR GENERATOR CXX_COMPILER
set -euo pipefail
source_dir=$1 prefix=$2 work=$3 generator=$4 cxx=$5
source "$(dirname "${BASH_SOURCE[0]}")/depot_server.sh"

rm -rf -- "${work}"
mkdir -p "${work}"
cmake -S "${source_dir}" -B "${work}/build" -G "${generator}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="${cxx}" \
  -DCMAKE_PREFIX_PATH="${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
cmake --build "${work}/build"

depot_dir=$(sed -n 's/^depot_DIR:PATH=//p' "${work}/build/CMakeCache.txt")
if [[ ${depot_dir} != "${prefix}"/* ]]; then
  echo "FAIL: find_package found depot in ${depot_dir}, not in ${prefix}" >&2
  exit 1
fi
program=${work}/build/train_one_step
library=$(ldd "${program}" | sed -n 's/.*libdepot_client\.so[^ ]* => \([^ ]*\).*/\1/p')
if [[ ${library} != "${prefix}"/* ]]; then
  echo "FAIL: train_one_step loads libdepot_client from '${library}'," \
       "not from ${prefix}" >&2
  exit 1
fi

start_depot_server "${prefix}/bin/depot-server" "${work}/depot-server.log"
"${program}" "${DEPOT_SERVER_ADDRESS}"
stop_depot_server
