#!/usr/bin/env bash
# ctest fixture of the install.* tests: installs the build into a fresh
# prefix with `cmake --install`, as a user would, and checks that every file a
# user needs is there.
# Usage: install_prefix.sh BUILD_DIR PREFIX LIBDIR VERSION
#   LIBDIR: CMAKE_INSTALL_LIBDIR (relative), VERSION: the project's version.
set -euo pipefail
build_dir=$1 prefix=$2 libdir=$3 version=$4

rm -rf -- "${prefix}"
cmake --install "${build_dir}" --prefix "${prefix}"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_file() { [[ -f $1 ]] || fail "$1 is not installed"; }

major=${version%%.*}
lib=${prefix}/${libdir}/libdepot_client.so
expect_file "${lib}.${version}"
[[ $(readlink "${lib}.${major}") == "libdepot_client.so.${version}" ]] ||
  fail "${lib}.${major} is not a link to libdepot_client.so.${version}"
[[ $(readlink "${lib}") == "libdepot_client.so.${major}" ]] ||
  fail "${lib} is not a link to libdepot_client.so.${major}"

for header in client depot grad_scaler param_scheduler \
              dtype export job_config layout shard_plan; do
  expect_file "${prefix}/include/depot/${header}.h"
done
# Every header an installed header includes from Depot is installed too.
while read -r included; do
  expect_file "${prefix}/include/${included}"
done < <(sed -n 's/^#include "\(depot\/[^"]*\)".*/\1/p' \
           "${prefix}"/include/depot/*.h | sort -u)
# ...and none includes a header of the source tree's other folders.
if grep -n '^#include "\(common\|client\|server\|proto\)/' \
     "${prefix}"/include/depot/*.h; then
  fail "an installed header includes a header that is not installed"
fi

for file in depotConfig depotConfigVersion depotTargets; do
  expect_file "${prefix}/${libdir}/cmake/depot/${file}.cmake"
done

pc=${prefix}/${libdir}/pkgconfig/depot-client.pc
expect_file "${pc}"
grep -qx "prefix=${prefix}" "${pc}" || fail "${pc} does not name the prefix"
grep -qx "Version: ${version}" "${pc}" || fail "${pc} has another version"

[[ -x ${prefix}/bin/depot-server ]] || fail "bin/depot-server is not installed"
unit=${prefix}/lib/systemd/system/depot-server.service
expect_file "${unit}"
grep -q "^ExecStart=${prefix}/bin/depot-server " "${unit}" ||
  fail "${unit} does not start ${prefix}/bin/depot-server"

if ((failures > 0)); then
  echo "${failures} check(s) failed on the installed tree ${prefix}" >&2
  exit 1
fi
echo "installed into ${prefix}: library, headers, CMake package, pkg-config file, server, unit"
