#!/usr/bin/env bash
# Builds Depot's libFuzzer targets with clang (-DDEPOT_FUZZ=ON) in their own
# build tree and runs each for a bounded time (docs/fuzzing.md). What the
# fuzz_libfuzzer ctest runs; also usable by hand:
#
#   tests/fuzz/run_libfuzzer.sh --source . --build /tmp/b-fuzz-clang \
#       --seconds 600 [--targets "step_codec checkpoint"] [--jobs 2]
#
# Each target starts from its seeds (written by its replay program) plus the
# corpus it grew in earlier runs of the same build tree. A crash, a sanitizer
# report, a timeout (-timeout), an allocation over -malloc_limit_mb or RSS over
# -rss_limit_mb fails the run; the input that did it is kept under --out and
# its bytes are printed (hex) for the report. Exits non-zero when any target
# failed or the build failed.
set -euo pipefail

source_dir=""
build_dir=""
cc=clang
cxx=clang++
seconds=20
targets="step_codec request checkpoint"
jobs=2
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --source) source_dir="$2"; shift 2 ;;
    --build) build_dir="$2"; shift 2 ;;
    --cc) cc="$2"; shift 2 ;;
    --cxx) cxx="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$source_dir" || -z "$build_dir" ]]; then
  echo "usage: $0 --source DIR --build DIR [--seconds N]" >&2
  exit 2
fi
out="${out:-$build_dir/findings}"
mkdir -p "$out"

start=$(date +%s)
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S "$source_dir" -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DDEPOT_CUDA=OFF -DDEPOT_FUZZ=ON \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
fi
build_targets=()
for t in $targets; do
  build_targets+=("depot_fuzz_$t" "depot_fuzz_${t}_replay")
done
cmake --build "$build_dir" -j"$jobs" --target "${build_targets[@]}"
echo "fuzz build: $(( $(date +%s) - start )) s"

failed=0
for t in $targets; do
  corpus="$build_dir/corpus/$t"
  "$build_dir/tests/fuzz/depot_fuzz_${t}_replay" --write_seeds "$corpus" >/dev/null
  log="$out/$t.log"
  echo "== depot_fuzz_$t: ${seconds} s"
  set +e
  "$build_dir/tests/fuzz/depot_fuzz_$t" "$corpus" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$out/$t-" >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' "$log" || true
  grep -E 'cov: ' "$log" | tail -1 || true
  if [[ $rc -ne 0 ]]; then
    failed=1
    echo "!! depot_fuzz_$t failed (exit $rc); log: $log"
    grep -E 'ERROR|DEPOT_FUZZ_CHECK|SUMMARY|#[0-9]+ 0x|^==' "$log" | head -60 || true
    for f in "$out/$t-"*; do
      [[ -f "$f" ]] || continue
      echo "-- $f ($(stat -c %s "$f") bytes):"
      od -An -tx1 -v "$f" | head -20
    done
  fi
done
echo "fuzz total: $(( $(date +%s) - start )) s"
exit $failed
