#!/usr/bin/env bash
# `cpack -G DEB` makes the two packages of cmake/DepotPackaging.cmake with the
# files, paths and dependencies they promise.
# Usage: check_debian_packages.sh BUILD_DIR WORK_DIR LIBDIR VERSION
set -euo pipefail
build_dir=$1 work=$2 libdir=$3 version=$4

rm -rf -- "${work}"
mkdir -p "${work}"
cpack -G DEB --config "${build_dir}/CPackConfig.cmake" -B "${work}"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
arch=$(dpkg --print-architecture)
server_deb=${work}/depot-server_${version}_${arch}.deb
client_deb=${work}/libdepot-client_${version}_${arch}.deb
for deb in "${server_deb}" "${client_deb}"; do
  [[ -f ${deb} ]] || { echo "FAIL: cpack made no ${deb}" >&2; ls "${work}" >&2; exit 1; }
done

# contains DEB PATH...: the package holds each path (./usr/...).
contains() {
  local deb=$1 listing path
  shift
  listing=$(dpkg-deb --contents "${deb}" | awk '{print $6}')
  for path in "$@"; do
    grep -qxF -- "./usr/${path}" <<<"${listing}" ||
      fail "$(basename "${deb}") lacks /usr/${path}"
  done
}
# depends_on DEB PACKAGE...: its Depends names each package.
depends_on() {
  local deb=$1 depends package
  shift
  depends=$(dpkg-deb --field "${deb}" Depends)
  for package in "$@"; do
    grep -qE "(^|[ ,])${package}( |,|$)" <<<"${depends}" ||
      fail "$(basename "${deb}") Depends: '${depends}' lacks ${package}"
  done
}
# file_of DEB PATH: the text of /usr/PATH in the package.
file_of() {
  dpkg-deb --fsys-tarfile "$1" | tar -xOf - "./usr/$2"
}

contains "${server_deb}" bin/depot-server lib/systemd/system/depot-server.service
depends_on "${server_deb}" adduser libc6 'libgrpc\+\+[0-9.]+' 'libprotobuf[0-9]+'
grep -q '^ExecStart=/usr/bin/depot-server ' \
    <(file_of "${server_deb}" lib/systemd/system/depot-server.service) ||
  fail "the packaged unit does not start /usr/bin/depot-server"
grep -qw postinst <<<"$(dpkg-deb --info "${server_deb}")" ||
  fail "depot-server has no postinst (it creates the depot user)"

major=${version%%.*}
contains "${client_deb}" \
  "${libdir}/libdepot_client.so.${version}" \
  "${libdir}/libdepot_client.so.${major}" \
  "${libdir}/libdepot_client.so" \
  include/depot/client.h include/depot/depot.h include/depot/export.h \
  "${libdir}/cmake/depot/depotConfig.cmake" \
  "${libdir}/pkgconfig/depot-client.pc"
depends_on "${client_deb}" libabsl-dev 'libabsl[0-9]+' \
  'libgrpc\+\+[0-9.]+' 'libprotobuf[0-9]+'
grep -qx 'prefix=/usr' <(file_of "${client_deb}" "${libdir}/pkgconfig/depot-client.pc") ||
  fail "the packaged depot-client.pc does not name prefix /usr"
grep -qw shlibs <<<"$(dpkg-deb --info "${client_deb}")" ||
  fail "libdepot-client has no shlibs file"

# Neither package holds what the other does, nor anything else of the build.
if grep -E 'include/|libdepot_client' <<<"$(dpkg-deb --contents "${server_deb}")"; then
  fail "depot-server holds client files"
fi
if grep -E 'bin/|systemd' <<<"$(dpkg-deb --contents "${client_deb}")"; then
  fail "libdepot-client holds server files"
fi

for deb in "${server_deb}" "${client_deb}"; do
  echo "$(basename "${deb}"): Depends: $(dpkg-deb --field "${deb}" Depends)"
done
if ((failures > 0)); then
  exit 1
fi
