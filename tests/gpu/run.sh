#!/usr/bin/env bash
# Runs Depot's GPU tests, the Python GPU test, gpt_bench.py and
# `depot-bench gpu` on a GPU machine and prints one
# table last (docs/performance.md, "depot-bench gpu"). From the repository
# root:
#
#   tests/gpu/run.sh [BENCH FLAGS...]      e.g. --gpu_elems=67108864
#
# Binaries: the bundle tests/gpu/bundle.sh made (gpu-bundle/, or
# $DEPOT_GPU_BUNDLE), for a machine without gRPC and protobuf; else, where
# there is a CUDA build tree (build/, or $DEPOT_BUILD_DIR), its binaries.
# Logs: every command's full output, the tests' JSON and the bench's JSON go
# to $OUT when it is set, else to a new directory under /tmp; the last line
# names it.
#
# Exits non-zero, saying why, when the binaries cannot load, when no GPU is
# visible, when a GPU test fails or is skipped, or when the bench fails. A
# ratio under its target is reported, not failed: a benchmark measures.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle="${DEPOT_GPU_BUNDLE:-$repo/gpu-bundle}"
build="${DEPOT_BUILD_DIR:-$repo/build}"
logs="${OUT:-}"
if [[ -z "$logs" ]]; then
  logs="$(mktemp -d /tmp/depot-gpu-run.XXXXXX)"
fi
mkdir -p "$logs"
summary="$logs/run_summary.txt"
: > "$summary"

say() { echo "run.sh: $*" | tee -a "$summary"; }
fail() {
  echo "run.sh: FAILED: $*" | tee -a "$summary" >&2
  echo "run.sh: logs in $logs" >&2
  exit 1
}

# ---- Binaries and their libraries ------------------------------------------
lib_path=""
if [[ -d "$bundle/bin" ]]; then
  bin="$bundle/bin"
  lib_path="$bundle/lib"
  # A copy that lost its modes (an archive, a sync) still runs.
  chmod +x "$bin"/* 2> /dev/null
  say "binaries: bundle $bundle ($(grep -m1 '^commit:' "$bundle/MANIFEST" 2>/dev/null || echo 'no MANIFEST'))"
elif [[ -x "$build/tests/bench/depot-bench" ]]; then
  bin=""
  say "binaries: build tree $build"
else
  fail "no binaries: neither $bundle/bin (make it with tests/gpu/bundle.sh on the build machine, then carry gpu-bundle/) nor a build in $build"
fi
server="${bin:-$build/server}/depot-server"
bench="${bin:-$build/tests/bench}/depot-bench"
tests="${bin:-$build/tests/gpu}/depot_gpu_tests"
for binary in "$server" "$bench" "$tests"; do
  [[ -x "$binary" ]] || fail "$binary is missing"
done

# NCCL is not in the bundle (too large): the machine's, from the loader's
# cache, the CUDA toolkit, or PyTorch's nvidia-nccl wheel.
nccl_dir() {
  local path
  path="$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')"
  if [[ -n "$path" ]]; then dirname "$path"; return; fi
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    if [[ -e "$dir/libnccl.so.2" ]]; then echo "$dir"; return; fi
  done
  command -v python3 >/dev/null || return
  python3 - <<'EOF' 2>/dev/null
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for root in (spec.submodule_search_locations or []) if spec else []:
    lib = os.path.join(root, "lib")
    if os.path.exists(os.path.join(lib, "libnccl.so.2")):
        print(lib)
        break
EOF
}
if [[ -n "$lib_path" ]] && ! grep -q '^nccl: none needed' "$bundle/MANIFEST" 2>/dev/null; then
  dir="$(nccl_dir)"
  if [[ -n "$dir" ]]; then
    lib_path="$lib_path:$dir"
    say "nccl: $dir/libnccl.so.2 (this machine's)"
  else
    say "nccl: not found on this machine (the loader check below says whether the binaries need it)"
  fi
fi
# Only Depot's binaries run with the bundle's libraries; python3 and the
# tools keep the machine's.
run_depot() {
  LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}
# Each part runs under a time limit (seconds), so that a hang in one leaves
# the others their time on a lent machine: exit 124 says it ran out.
# $DEPOT_GPU_TIMEOUT_{TESTS,PYTHON,GPT,BENCH} change them.
limited() {  # limited SECONDS run_depot COMMAND...
  local seconds="$1"
  shift 2
  LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout --kill-after=10 "$seconds" "$@"
}

# The loader check: each binary starts (its usage, whatever its exit code,
# shows that every library loaded; the loader itself exits 127). If the
# machine's C++ runtime is too old for them, the bundle's own (lib-cxx/)
# goes on the path.
starts() {
  local err rc
  err="$(run_depot "$@" 2>&1 > /dev/null)"
  rc=$?
  echo "$* -> exit $rc${err:+: $err}" | head -5 >> "$logs/load_check.log"
  ((rc != 127)) && ! grep -q 'error while loading shared libraries\|version .* not found' <<< "$err"
}
load_check() {
  starts "$server" --help && starts "$bench" --help &&
    starts "$tests" --gtest_list_tests
}
: > "$logs/load_check.log"
if ! load_check; then
  if [[ -n "$lib_path" && -d "$bundle/lib-cxx" ]] &&
     grep -q 'GLIBCXX\|CXXABI\|GCC_' "$logs/load_check.log"; then
    say "the machine's libstdc++ is too old for the binaries: using the bundle's (lib-cxx/)"
    lib_path="$lib_path:$bundle/lib-cxx"
    : > "$logs/load_check.log"
    load_check || fail "the binaries do not load: $(tail -3 "$logs/load_check.log")"
  else
    fail "the binaries do not load: $(tail -3 "$logs/load_check.log")"
  fi
fi
say "loader check: depot-server, depot-bench and depot_gpu_tests start"

# ---- A GPU must be visible -------------------------------------------------
if command -v nvidia-smi > /dev/null; then
  nvidia-smi > "$logs/nvidia_smi.log" 2>&1
  gpus="$(nvidia-smi -L 2>> "$logs/nvidia_smi.log")"
  [[ -n "$gpus" ]] || fail "no GPU visible: nvidia-smi -L lists none ($(tail -1 "$logs/nvidia_smi.log"))"
  say "gpu: $(echo "$gpus" | head -1)"
else
  say "nvidia-smi not found: the tests decide whether a GPU is visible"
fi

# ---- The GPU tests (ctest -L gpu runs this binary's tests) -----------------
# All but GpuKernelsWithoutDeviceTest, which checks the error a launch gives
# on a machine without a device and skips where there is one.
limited "${DEPOT_GPU_TIMEOUT_TESTS:-180}" run_depot "$tests" --gtest_output="json:$logs/gpu_tests.json" \
  --gtest_filter=-GpuKernelsWithoutDeviceTest.* \
  > "$logs/gpu_tests.log" 2>&1
tests_rc=$?
if grep -q 'no CUDA device' "$logs/gpu_tests.log"; then
  fail "no GPU visible: $(grep -m1 'no CUDA device' "$logs/gpu_tests.log")"
fi
say "gpu tests: exit $tests_rc ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$logs/gpu_tests.log" | tr -s ' ' | paste -sd ';' -))"

# ---- DepotOptimizer on CUDA (the machine's python3 and torch) -------------
py_rc=""
client_lib="${bin:+$bundle/lib/libdepot_client.so.0}"
client_lib="${client_lib:-$build/client/libdepot_client.so}"
if python3 -c 'import torch, pytest; assert torch.cuda.is_available()' \
    > "$logs/torch_cuda_check.log" 2>&1; then
  DEPOT_CLIENT_LIBRARY="$client_lib" DEPOT_SERVER="$server" \
    limited "${DEPOT_GPU_TIMEOUT_PYTHON:-120}" run_depot python3 -m pytest -q -rs -p no:cacheprovider \
    "$repo/tests/gpu/test_torch_cuda.py" > "$logs/torch_cuda.log" 2>&1
  py_rc=$?
  say "python GPU test (DepotOptimizer on CUDA): exit $py_rc ($(tail -1 "$logs/torch_cuda.log"))"
else
  say "python GPU test not run: python3 lacks torch with CUDA or pytest ($(tail -1 "$logs/torch_cuda_check.log"))"
fi

# ---- A GPT-style step against torch's fused AdamW (gpt_bench.py) ----------
# $DEPOT_GPT_BENCH_FLAGS: more flags for every run (e.g. "--batch=16
# --steps=40"). $DEPOT_GPT_BENCH_VARIANTS: runs to make one after the other,
# separated by ';', each with its own extra flags (an empty one: none), to
# compare settings side by side in one call, e.g.
# ";--server_nice=10;;--server_nice=10" alternates without and with (a
# trailing empty one is dropped: lead with it). Each run has its own time
# limit ($DEPOT_GPU_TIMEOUT_GPT, 240 s); its log is gpt_bench.N.log and its
# JSON line goes to gpt_bench.jsonl.
gpt_rc=""
if [[ -n "$py_rc" ]]; then
  read -r -a gpt_flags <<< "${DEPOT_GPT_BENCH_FLAGS:-}"
  IFS=';' read -r -a gpt_variants <<< "${DEPOT_GPT_BENCH_VARIANTS:-}"
  (( ${#gpt_variants[@]} > 0 )) || gpt_variants=("")
  gpt_rc=0
  : > "$logs/gpt_bench.jsonl"
  for n in "${!gpt_variants[@]}"; do
    read -r -a variant_flags <<< "${gpt_variants[$n]}"
    log="$logs/gpt_bench.$n.log"
    DEPOT_CLIENT_LIBRARY="$client_lib" \
      limited "${DEPOT_GPU_TIMEOUT_GPT:-240}" run_depot python3 "$repo/tests/gpu/gpt_bench.py" --server="$server" \
      --json "${gpt_flags[@]}" "${variant_flags[@]}" > "$log" 2>&1
    rc=$?
    (( rc == 0 )) || gpt_rc=$rc
    grep '^{' "$log" >> "$logs/gpt_bench.jsonl"
    say "gpt_bench.py run $n (${gpt_variants[$n]:-no extra flags}): exit $rc"
    grep -v '^{' "$log" | tail -6 | tee -a "$summary"
  done
fi

# ---- The trainer thread's cost of DepotOptimizer's hooks (hook_bench.py) ---
# Per micro-batch, a 24-layer GPT of small dimensions (launch-bound) with the
# CUDA engine, against torch.optim: what the hooks add to the thread that
# launches the kernels (gpt_bench.py's host_s says whether that thread is
# the bottleneck of the real step).
if [[ -n "$py_rc" ]]; then
  DEPOT_CLIENT_LIBRARY="$client_lib" \
    limited "${DEPOT_GPU_TIMEOUT_GPT:-240}" run_depot python3 "$repo/tests/gpu/hook_bench.py" --server="$server" \
    --device=cuda --json > "$logs/hook_bench.log" 2>&1
  say "hook_bench.py: exit $? ($(grep -v '^{' "$logs/hook_bench.log" | tail -1))"
fi

# ---- depot-bench gpu -------------------------------------------------------
DEPOT_SERVER_BINARY="$server" limited "${DEPOT_GPU_TIMEOUT_BENCH:-180}" run_depot "$bench" gpu --json "$@" \
  > "$logs/bench_gpu.json" 2> "$logs/bench_gpu.log"
bench_rc=$?
say "depot-bench gpu: exit $bench_rc"

# ---- One table, last -------------------------------------------------------
table() {
  python3 - "$logs/gpu_tests.json" "$logs/bench_gpu.json" "$tests_rc" "$bench_rc" \
    "$logs/bench_gpu.log" <<'EOF'
import json, sys

tests_json, bench_json, tests_rc, bench_rc, bench_log = sys.argv[1:]
rows = []
try:
    report = json.load(open(tests_json))
    total = report.get("tests", 0)
    failed = report.get("failures", 0)
    skipped = sum(1 for suite in report.get("testsuites", [])
                  for t in suite.get("testsuite", [])
                  if t.get("result") == "SKIPPED")
    rows.append(("GPU tests (ctest -L gpu)",
                 f"{total - failed - skipped}/{total} passed, {failed} failed, "
                 f"{skipped} skipped", "", "", "all pass"))
except (OSError, ValueError) as e:
    rows.append(("GPU tests (ctest -L gpu)", f"no report (exit {tests_rc})",
                 "", "", "all pass"))
lines = {}
try:
    for text in open(bench_json):
        text = text.strip()
        if text.startswith("{"):
            line = json.loads(text)
            lines[line.get("part")] = line
except (OSError, ValueError):
    pass
p = lines.get("pipeline")
if p:
    rows.append(("pipeline D2H+H2D (engine, real servers)",
                 f"{p['pipeline_gb_per_s']:.2f} GB/s",
                 f"pinned memcpy both ways {p['memcpy_bidir_gb_per_s']:.2f} GB/s",
                 f"{p['ratio']:.3f}", ">= 0.85"))
    rows.append(("  step vs the wire alone (loopback gRPC)",
                 f"step {p['step_s']:.4f} s",
                 f"wire {p['wire_s']:.4f} s", f"{p['ratio_wire']:.3f}",
                 f"limited by {p['limited_by']}"))
    rows.append(("  pinned memcpy one way",
                 f"D2H {p['memcpy_d2h_gb_per_s']:.2f} GB/s",
                 f"H2D {p['memcpy_h2d_gb_per_s']:.2f} GB/s", "", ""))
    rows.append(("  pinned memory (stated = allocated)",
                 f"{p['pinned_bytes'] / 2**20:.0f} MiB",
                 f"{p['pinned_stated_bytes'] / 2**20:.0f} MiB",
                 f"{p['pinned_bytes'] / p['pinned_stated_bytes']:.3f}", "1"))
else:
    rows.append(("pipeline", f"no result (exit {bench_rc})", "", "", ">= 0.85"))
k = lines.get("kernel")
if k:
    rows.append((f"AdamW update, {k['dtype']} grads/weights, "
                 f"{k['moment_dtype']} moments",
                 f"{k['update_gb_per_s']:.0f} GB/s",
                 f"device copy {k['copy_gb_per_s']:.0f} GB/s",
                 f"{k['ratio']:.3f}", "(memory-bound: near 1)"))
elif p:
    rows.append(("AdamW update", f"no result (exit {bench_rc})", "", "", ""))
if not lines and int(bench_rc) != 0:
    try:
        reason = open(bench_log).read().strip().splitlines()[-1]
    except (OSError, IndexError):
        reason = ""
    rows.append(("depot-bench gpu", "failed", reason[:70], "", ""))
header = ("figure", "measured", "limit (same run)", "ratio", "target")
widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
device = (p or k or {}).get("device", "")
print(f"== Depot on the GPU {device}")
for r in [header] + rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
EOF
}
if command -v python3 > /dev/null; then
  table | tee -a "$summary"
else
  echo "(no python3: the raw results)"; cat "$logs/bench_gpu.json"
fi

status=0
if ((tests_rc != 0)); then
  echo "run.sh: FAILED: GPU tests exited $tests_rc ($logs/gpu_tests.log)" >&2
  status=1
fi
if grep -q '^\[  SKIPPED \] [0-9]' "$logs/gpu_tests.log"; then
  echo "run.sh: FAILED: GPU tests were skipped on a GPU machine ($logs/gpu_tests.log)" >&2
  status=1
fi
if [[ -n "$py_rc" ]] && { ((py_rc != 0)) || grep -q 'skipped' "$logs/torch_cuda.log"; }; then
  echo "run.sh: FAILED: the python GPU test failed or skipped ($logs/torch_cuda.log)" >&2
  status=1
fi
if [[ -n "$gpt_rc" ]] && ((gpt_rc != 0)); then
  echo "run.sh: FAILED: gpt_bench.py exited $gpt_rc ($logs/gpt_bench.*.log)" >&2
  status=1
fi
if ((bench_rc != 0)); then
  echo "run.sh: FAILED: depot-bench gpu exited $bench_rc: $(tail -1 "$logs/bench_gpu.log")" >&2
  status=1
fi
echo "run.sh: logs in $logs"
exit $status
