"""Smoke test of depot-bench: each subcommand on a tiny size with --json must
exit 0 and print JSON objects with the documented keys. No timing is checked."""
import json
import subprocess
import sys

KEYS = {
    "kernel": {"bench", "ratio", "params", "bytes_per_param",
               "update_params_per_s", "update_gb_per_s",
               "probe_params_per_s", "probe_gb_per_s"},
    "memory": {"bench", "ratio", "params", "moment_dtype", "point",
               "baseline_rss_mib", "rss_mib", "job_mib", "bytes_per_param",
               "limit_mib"},
    "transport": {"bench", "ratio", "link", "params", "chunk_elems",
                  "connections", "inflight", "bytes_per_step",
                  "depot_step_seconds", "raw_step_seconds", "depot_gb_per_s",
                  "raw_gb_per_s", "tls_step_seconds", "tls_gb_per_s",
                  "tls_ratio", "tls_vs_plaintext"},
    "step": {"bench", "ratio", "speedup", "link", "params", "step_s",
             "xfer_s", "update_s", "serial_s"},
    "pipeline": {"bench", "ratio", "slowest", "elems", "local_ranks",
                 "link_gb_per_s", "d2h_s", "h2d_s", "wire_s", "step_s",
                 "link_d2h_s", "pinned_stated_bytes", "pinned_bytes",
                 "pinned_allocated_bytes", "pinned_peak_bytes",
                 "pinned_quarter_model_bytes"},
    "gpu": {"bench", "ratio", "part", "device"},
    "checkpoint": {"bench", "ratio", "normal_s", "capture_s", "writing_s",
                   "checkpoints", "checkpoint_bytes", "checkpoint_gb_per_s",
                   "disk_gb_per_s", "write_ratio"},
}
GPU_KEYS = {
    "pipeline": {"memcpy_d2h_gb_per_s", "memcpy_h2d_gb_per_s",
                 "memcpy_bidir_gb_per_s", "pipeline_gb_per_s", "step_s",
                 "wire_s", "ratio_wire", "ratio_stages", "limited_by",
                 "pinned_bytes", "pinned_stated_bytes"},
    "kernel": {"update_gb_per_s", "copy_gb_per_s", "bytes_per_param"},
}
EXPECTED_LINES = {"kernel": 1, "memory": 4, "transport": 1, "step": 1,
                  "pipeline": 1, "gpu": 2, "checkpoint": 1}


def run(binary, command, args):
    out = subprocess.run([binary, command, "--json"] + args,
                         capture_output=True, text=True, timeout=150)
    if out.returncode != 0:
        sys.exit(f"depot-bench {command} exited {out.returncode}:\n{out.stderr}")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line]
    if len(lines) != EXPECTED_LINES[command]:
        sys.exit(f"{command}: expected {EXPECTED_LINES[command]} lines, got:\n"
                 f"{out.stdout}")
    for line in lines:
        missing = KEYS[command] - line.keys()
        if missing or line["bench"] != command:
            sys.exit(f"{command}: bad line {line} (missing {sorted(missing)})")
        if not line["ratio"] > 0:
            sys.exit(f"{command}: ratio not positive in {line}")
    return lines


def main():
    binary = sys.argv[1]
    run(binary, "kernel",
        ["--params=100000", "--repeats=1", "--chunk_elems=4096"])
    run(binary, "kernel",
        ["--params=100000", "--repeats=1", "--moment_dtype=bf16"])
    run(binary, "memory", ["--params=100000"])
    run(binary, "kernel", ["--params=100000", "--repeats=1", "--isa=scalar"])
    run(binary, "transport",
        ["--transport_params=1000000", "--transport_chunk_elems=65536",
         "--transport_repeats=1", "--transport_steps=1"])
    step = ["--step_params=1000000", "--step_repeats=1"]
    run(binary, "step", step + ["--step_link=loopback"])
    # The shaped link needs network namespaces (root); without them the
    # bench falls back to loopback and says so in "note".
    [line] = run(binary, "step", step + ["--step_link=veth"])
    if line["link"] != "veth" and not line.get("note"):
        sys.exit(f"step: fell back to {line['link']} without a note: {line}")
    # The transfer engine on throttled host devices: one rank, then a node of
    # two (HostCollective). Pinned memory is checked, not timed: what the
    # engine says it holds, what it allocated (peak too), slots x chunk bytes,
    # and the same for a job a quarter the size must all be equal.
    pipeline = ["--pipeline_elems=262144", "--pipeline_chunk_elems=16384",
                "--pipeline_steps=1", "--pipeline_link_gb_per_s=2"]
    for ranks in ("1", "2"):
        [line] = run(binary, "pipeline", pipeline + [f"--pipeline_ranks={ranks}"])
        pinned = {line[k] for k in ("pinned_stated_bytes", "pinned_bytes",
                                    "pinned_allocated_bytes",
                                    "pinned_peak_bytes",
                                    "pinned_quarter_model_bytes")}
        if len(pinned) != 1:
            sys.exit(f"pipeline: pinned memory not as stated: {line}")
    # The GPU bench: where there is no CUDA device (CI), or no CUDA in the
    # build, it must fail with the reason, not crash or print figures.
    gpu = [binary, "gpu", "--json", "--gpu_memcpy_bytes=1048576",
           "--gpu_memcpy_repeats=1", "--gpu_elems=262144",
           "--gpu_chunk_elems=16384", "--gpu_steps=1",
           "--gpu_kernel_elems=65536", "--gpu_kernel_repeats=1"]
    out = subprocess.run(gpu, capture_output=True, text=True, timeout=150)
    if out.returncode == 0:
        for line in run(binary, "gpu", gpu[3:]):
            missing = GPU_KEYS[line["part"]] - line.keys()
            if missing:
                sys.exit(f"gpu: {line} lacks {sorted(missing)}")
    elif out.returncode != 1 or not (
            "no CUDA device" in out.stderr or "without CUDA" in out.stderr):
        sys.exit(f"depot-bench gpu without a device exited {out.returncode} "
                 f"without the reason:\n{out.stderr}")
    [line] = run(binary, "checkpoint",
                 ["--checkpoint_params=65536", "--checkpoint_steps=40",
                  "--checkpoint_every=20", "--checkpoint_threads=1"])
    if line["checkpoints"] < 1 or line["checkpoint_bytes"] <= 0:
        sys.exit(f"checkpoint: no checkpoint written: {line}")
    print("depot-bench smoke OK")


if __name__ == "__main__":
    main()
