#!/usr/bin/python3
"""Peak trainer memory of DepotOptimizer's checkpoint by value, before and
after the state became a tensor over the library's buffer (issue 12 part 4).

    DEPOT_CLIENT_LIBRARY=build/client/libdepot_client.so \\
    DEPOT_SERVER=build/server/depot-server \\
        /usr/bin/python3 scripts/state_dict_memory.py [--params=67108864] \
        [--before_library=OLD/libdepot_client.so]

Starts one depot-server, then measures each case in its own process (freed
memory a process keeps would hide the next case's peak): the job holds one
AdamW tensor of --params elements, one step is taken, and the peak resident
set size (VmHWM, reset through /proc/self/clear_refs) is read around

  save, bytes:  the old state_dict(): Job.save_state() as Python bytes in
                the dict, then torch.save to a file;
  save, tensor: state_dict() (a uint8 tensor over the library's buffer),
                then torch.save;
  load, bytes / tensor: torch.load of that file and load_state_dict.

It prints the peak above the process's resident size before the case, in
bytes per byte of saved state. The servers' memory is not counted.
--before_library: the library the bytes cases load (a build from before the
change, to compare the library's own copies too; it must implement the
package's depot.h API version); default the same one.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))


def _status_kib(field):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _peak_above_now(action):
    """Runs action(); the peak resident bytes above the current ones."""
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM
    before = _status_kib("VmRSS")
    action()
    return (_status_kib("VmHWM") - before) * 1024


def _case(server, params, case, path):
    """One measurement, in this (fresh) process; prints a JSON line."""
    import torch

    import depot
    from depot.torch import DepotOptimizer

    weight = torch.nn.Parameter(torch.zeros(params))
    with depot.Client([server]) as client:
        opt = DepotOptimizer([weight], client=client,
                             job_name=f"memory-{case}-{os.getpid()}",
                             lr=1e-3)
        weight.grad = torch.full((params,), 1e-3)
        opt.step()
        result = {"case": case}
        try:
            if case.startswith("save"):
                def save():
                    if case == "save-bytes":  # what state_dict() made before
                        state = {"state": {},
                                 "param_groups": opt._packed_groups(),
                                 "depot_state": opt.job.save_state(),
                                 "depot_step": opt._depot_step,
                                 "depot_grad_scaler":
                                     opt._grad_scaler().state_dict()}
                    else:
                        state = opt.state_dict()
                    torch.save(state, path)
                    result["state_bytes"] = len(state["depot_state"])
                result["peak"] = _peak_above_now(save)
            else:
                result["peak"] = _peak_above_now(
                    lambda: opt.load_state_dict(torch.load(path)))
        finally:
            opt.job.delete()
            opt.close()
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--case")  # internal: one measurement
    parser.add_argument("--server")
    parser.add_argument("--path")
    parser.add_argument("--before_library")
    args = parser.parse_args()
    if args.case:
        _case(args.server, args.params, args.case, args.path)
        return
    import server_process
    binary = os.environ.get("DEPOT_SERVER",
                            str(REPO / "build" / "server" / "depot-server"))
    with server_process.start_server(binary, ["--threads=2"]) as server, \
            tempfile.TemporaryDirectory() as scratch:
        rows = []
        for kind in ("bytes", "tensor"):
            path = os.path.join(scratch, f"{kind}.pt")
            environment = dict(os.environ)
            if kind == "bytes" and args.before_library:
                environment["DEPOT_CLIENT_LIBRARY"] = args.before_library
            for step in ("save", "load"):
                output = subprocess.run(
                    [sys.executable, __file__, f"--case={step}-{kind}",
                     f"--server={server.address}", f"--params={args.params}",
                     f"--path={path}"], check=True, stdout=subprocess.PIPE,
                    text=True, env=environment).stdout
                rows.append(json.loads(output.strip().splitlines()[-1]))
            rows[-1]["file_bytes"] = rows[-2]["file_bytes"] = \
                os.path.getsize(path)
    state_bytes = rows[-2]["state_bytes"]
    print(f"{args.params} parameters of AdamW, a state of {state_bytes:,d} "
          f"bytes")
    for row in rows:
        print(f"{row['case']:12s} peak {row['peak']:>13,d} bytes = "
              f"{row['peak'] / state_bytes:.2f} x the state; file "
              f"{row['file_bytes']:>13,d} bytes")


if __name__ == "__main__":
    main()
