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
}
EXPECTED_LINES = {"kernel": 1, "memory": 4}


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


def main():
    binary = sys.argv[1]
    run(binary, "kernel",
        ["--params=100000", "--repeats=1", "--chunk_elems=4096"])
    run(binary, "kernel",
        ["--params=100000", "--repeats=1", "--moment_dtype=bf16"])
    run(binary, "memory", ["--params=100000"])
    print("depot-bench smoke OK")


if __name__ == "__main__":
    main()
