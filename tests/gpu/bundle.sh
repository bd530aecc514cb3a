#!/usr/bin/env bash
# Makes a bundle of Depot's GPU binaries and the shared libraries they need,
# for a GPU machine that has CUDA's driver, CMake and PyTorch but no gRPC or
# protobuf development packages (docs/performance.md, "depot-bench gpu").
# Run it on the build machine, after a CUDA build:
#
#   tests/gpu/bundle.sh [BUILD_DIR [BUNDLE_DIR]]     # build/, gpu-bundle/
#
# then, on the GPU machine, from the repository root:
#
#   tests/gpu/run.sh                                  # reads gpu-bundle/
#
# The bundle (git-ignored) holds:
#   bin/      depot-server, depot-bench, depot_gpu_tests, stripped copies;
#   lib/      every library they load that is not the C library, the
#             loader, the CUDA driver, NCCL or the C++ runtime: gRPC,
#             protobuf, abseil, OpenSSL, ..., and libcudart, the CUDA runtime
#             they were compiled against (CUDA 13 runs on any driver of the
#             13 series, >= 580, by CUDA's minor-version compatibility);
#   lib-cxx/  libstdc++ and libgcc_s of this machine, which run.sh puts on
#             the library path only when the GPU machine's own are too old to
#             load the binaries (a newer one, the usual case, serves them);
#   MANIFEST  where each file came from, the commit, the CUDA version, the
#             newest glibc and libstdc++ symbol versions the binaries need.
# Not carried: the C library and the loader (they must be the machine's);
# libcuda (the driver's, with the GPU); NCCL (libnccl.so.2 is over 200 MiB,
# more than the 64 MiB a device run carries: run.sh takes the GPU machine's,
# from the CUDA toolkit or PyTorch's nvidia-nccl wheel; NCCL 2's ABI is
# stable across its minor versions).
#
# Prints the bundle's size, with the repository's tracked files, against the
# 64 MiB a device run carries (/work/.library/device/README.md), and fails
# when it is over.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$repo/build}"
bundle="${2:-$repo/gpu-bundle}"
limit_bytes=$((64 * 1024 * 1024))

die() { echo "bundle.sh: $*" >&2; exit 1; }

binaries=(
  "$build/server/depot-server"
  "$build/tests/bench/depot-bench"
  "$build/tests/gpu/depot_gpu_tests"
)
for binary in "${binaries[@]}"; do
  [[ -x "$binary" ]] || die "$binary is missing: build it first (CUDA on), e.g.
  cmake -S $repo -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build $build --target depot-server depot-bench depot_gpu_tests"
done
if ! ldd "$build/tests/bench/depot-bench" | grep -q 'libcudart'; then
  die "$build/tests/bench/depot-bench does not load libcudart: configure with CUDA (DEPOT_CUDA=AUTO or ON, nvcc on the PATH)"
fi

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/lib-cxx"
manifest="$bundle/MANIFEST"
{
  echo "# Depot GPU bundle, made by tests/gpu/bundle.sh"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1))"
  echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "build: $build ($(grep -m1 '^CMAKE_BUILD_TYPE:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2 || echo '?'))"
  echo "cuda: $(grep -h 'set(CMAKE_CUDA_COMPILER_VERSION' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1 | sed 's/.*"\(.*\)".*/\1/')"
} > "$manifest"

for binary in "${binaries[@]}"; do
  name="$(basename "$binary")"
  cp "$binary" "$bundle/bin/$name"
  strip --strip-unneeded "$bundle/bin/$name"
  echo "bin/$name <- $binary (stripped)" >> "$manifest"
done
# The client library and its CUDA backend, for the Python package's GPU test
# (tests/gpu/test_torch_cuda.py): by their SONAMEs, side by side, as the
# client looks for the backend beside itself.
for library in libdepot_client.so.0 libdepot_cuda.so.0; do
  [[ -e "$build/client/$library" ]] || die "$build/client/$library is missing: build depot_client (CUDA on)"
  cp -L "$build/client/$library" "$bundle/lib/$library"
  strip --strip-unneeded "$bundle/lib/$library"
  echo "lib/$library <- $(readlink -f "$build/client/$library") (stripped)" >> "$manifest"
done
binaries+=("$build/client/libdepot_client.so.0" "$build/client/libdepot_cuda.so.0")

# Libraries: what the loader resolves for each binary here.
declare -A seen=()
missing=()
while read -r soname path; do
  [[ -n "${seen[$soname]:-}" ]] && continue
  seen[$soname]=1
  case "$soname" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|\
    librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnsl.so*|libmvec.so*)
      continue ;;  # glibc: the machine's own
    libcuda.so*|libnvidia-*)
      continue ;;  # the driver: the machine's own
    libnccl.so*)
      echo "not carried: $soname ($path): the GPU machine's NCCL" >> "$manifest"
      continue ;;
    libstdc++.so*|libgcc_s.so*)
      cp -L "$path" "$bundle/lib-cxx/$soname"
      echo "lib-cxx/$soname <- $path" >> "$manifest"
      continue ;;
  esac
  if [[ "$path" == "not" ]]; then
    missing+=("$soname")
    continue
  fi
  cp -L "$path" "$bundle/lib/$soname"
  echo "lib/$soname <- $(readlink -f "$path")" >> "$manifest"
done < <(for binary in "${binaries[@]}"; do
           ldd "$binary" | awk '$2 == "=>" { print $1, $3 }'  # the vdso and the loader have no "=>"
         done)
((${#missing[@]} == 0)) || die "the loader cannot find ${missing[*]} here"

# What the binaries ask of the machine's glibc and (if not lib-cxx's)
# libstdc++.
newest() {
  objdump -T "${binaries[@]}" "$bundle"/lib/*.so* 2>/dev/null |
    grep -o "$1_[0-9.]*" | sort -Vu | tail -1
}
{
  echo "needs: $(newest GLIBC) (glibc), $(newest GLIBCXX) (libstdc++)"
  nccl="$(for binary in "${binaries[@]}"; do ldd "$binary"; done | awk '/libnccl/ && !found { print $1; found = 1 }')"  # no early exit: ldd would die of SIGPIPE under pipefail
  if [[ -n "$nccl" ]]; then
    echo "nccl: $nccl (not carried: the GPU machine's)"
  else
    echo "nccl: none needed"
  fi
} >> "$manifest"

bundle_bytes=$(du -sb "$bundle" | cut -f1)
tracked_bytes=$(git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 du -cb 2>/dev/null) | awk '/\ttotal$/ { s += $1 } END { print s + 0 }')
total=$((bundle_bytes + tracked_bytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "size: bundle $(mib "$bundle_bytes") + tracked files $(mib "$tracked_bytes") = $(mib "$total") of the 64 MiB a device run carries" | tee -a "$manifest"
if ((total > limit_bytes)); then
  die "over the 64 MiB a device run carries"
fi
echo "bundle: $bundle (carry it as \"$(realpath --relative-to="$repo" "$bundle")\"; run tests/gpu/run.sh there)"
