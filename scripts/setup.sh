#!/usr/bin/env bash
# Installs the Debian (bookworm) packages Depot needs to build, test and run its demo.
# Only missing packages are installed; when everything is present no apt command runs.
# Uses sudo when not run as root.
#
# python3-torch, python3-numpy and python3-pytest run the Python package's tests
# (tests/python/, part of ctest) and the PyTorch example; python3-pip,
# python3-setuptools and python3-wheel build its wheel (offline, in
# tests/python/test_packaging.py). dpkg-dev (dpkg-shlibdeps) and file let
# `cpack -G DEB` compute the .deb packages' dependencies (tests/install/).
# shellcheck, systemd (systemd-analyze) and python3-yaml check deploy/'s files
# (tests/deploy/); chromium opens the servers' status page headless there.
# openssl makes the TLS tests' certificates (libssl-dev: the token hashes);
# clang and libfuzzer-14-dev build the fuzz targets (tests/fuzz/).
#
# Extra packages can be requested with DEPOT_OPTIONAL_PACKAGES, e.g.
#   DEPOT_OPTIONAL_PACKAGES="gdb" ./scripts/setup.sh
set -euo pipefail

REQUIRED_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus curl ca-certificates
  python3 python3-numpy python3-pytest python3-torch
  python3-pip python3-setuptools python3-wheel
  dpkg-dev file
  shellcheck systemd python3-yaml chromium
  openssl libssl-dev clang libfuzzer-14-dev
)
read -r -a OPTIONAL_PACKAGES <<<"${DEPOT_OPTIONAL_PACKAGES:-}"

is_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

missing=()
for pkg in "${REQUIRED_PACKAGES[@]}" "${OPTIONAL_PACKAGES[@]}"; do
  is_installed "${pkg}" || missing+=("${pkg}")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages are installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
as_root=()
if ((EUID != 0)); then
  as_root=(sudo)
fi
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
