#!/usr/bin/env bash
# A C99 program (c_step.c) built with nothing but
#   cc c_step.c $(pkg-config --cflags --libs depot-client)
# against the installed prefix, run with the installed library, does one
# training step through the C API against the installed depot-server.
# Usage: check_c_program.sh SOURCE PREFIX LIBDIR WORK_DIR
set -euo pipefail
source=$1 prefix=$2 libdir=$3 work=$4
source "$(dirname "${BASH_SOURCE[0]}")/depot_server.sh"

rm -rf -- "${work}"
mkdir -p "${work}"
export PKG_CONFIG_PATH=${prefix}/${libdir}/pkgconfig
flags=$(pkg-config --cflags --libs depot-client)
echo "pkg-config --cflags --libs depot-client: ${flags}"
# shellcheck disable=SC2086  # the flags are words
"${CC:-cc}" -std=c99 -pedantic -Wall -Wextra -Werror -o "${work}/c_step" \
  "${source}" ${flags}

export LD_LIBRARY_PATH=${prefix}/${libdir}
library=$(ldd "${work}/c_step" | sed -n 's/.*libdepot_client\.so[^ ]* => \([^ ]*\).*/\1/p')
if [[ ${library} != "${prefix}"/* ]]; then
  echo "FAIL: c_step loads libdepot_client from '${library}', not from ${prefix}" >&2
  exit 1
fi

start_depot_server "${prefix}/bin/depot-server" "${work}/depot-server.log"
"${work}/c_step" "${DEPOT_SERVER_ADDRESS}"
stop_depot_server
