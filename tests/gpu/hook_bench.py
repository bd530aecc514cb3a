#!/usr/bin/python3
"""The trainer thread's cost of DepotOptimizer's hooks, per micro-batch.

DepotOptimizer (engine mode) runs Python on the thread that launches the
model's kernels: a gradient hook per parameter in every backward, and with
attach() a forward pre-hook per module. With gradient accumulation they run
in every micro-batch. When that thread is the bottleneck (small kernels, a
busy host) their time is step time, which torch.optim's step does not pay.

This program times one micro-batch (forward and backward, inside no_sync as
an accumulation's micro-batches are) of the same GPT-structured model
(gpt_bench.GPT: 24 layers give 293 tensors in 148 modules) with
torch.optim.AdamW and with DepotOptimizer, alternating, `--rounds` rounds of
`--micro` micro-batches each, and prints the medians, their difference (the
hooks' cost) and ratio. Small dimensions make the loop a measure of host
work, as a launch-bound GPU loop is; on the CPU the host engine runs the
same driver and hooks as the CUDA one. One depot-server on loopback.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_bench  # noqa: E402  (puts the repo's depot on sys.path)
import depot  # noqa: E402
import server_process  # noqa: E402
from depot.torch import DepotOptimizer  # noqa: E402


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d_model", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30,
                        help="alternating rounds of torch and Depot")
    parser.add_argument("--micro", type=int, default=16,
                        help="micro-batches timed per round")
    parser.add_argument("--delayed_update", action="store_true")
    parser.add_argument("--no_attach", action="store_true",
                        help="leave the forward pre-hooks out")
    parser.add_argument("--server", default=os.environ.get("DEPOT_SERVER"),
                        help="the depot-server binary")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def main():
    args = parse()
    if not args.server:
        sys.exit("hook_bench.py: name the depot-server binary with --server "
                 "or $DEPOT_SERVER")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("hook_bench.py: no CUDA device")

    def model():
        torch.manual_seed(0)
        return gpt_bench.GPT(args.vocab, args.seq, args.d_model, args.layers,
                             args.heads).to(device)

    x = torch.randint(args.vocab, (1, args.seq), device=device)
    y = torch.randint(args.vocab, (1, args.seq), device=device)

    def micro(m):
        loss = torch.nn.functional.cross_entropy(
            m(x).view(-1, args.vocab), y.view(-1))
        loss.backward()

    def timed(m, context):
        start = time.perf_counter()
        with context():
            for _ in range(args.micro):
                micro(m)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return (time.perf_counter() - start) / args.micro

    server = server_process.start_server(args.server, ["--threads=1"])
    try:
        with depot.Client([server.address]) as client:
            client.wait_for_servers(60)
            plain = model()
            plain_opt = torch.optim.AdamW(plain.parameters())
            hooked = model()
            opt = DepotOptimizer(
                hooked.parameters(), client=client,
                job_name=f"hook-bench-{os.getpid()}-{time.time_ns()}",
                engine="host" if device.type == "cpu" else "cuda",
                delayed_update=args.delayed_update)
            if not args.no_attach:
                opt.attach(hooked)
            # One whole step each, so that every .grad exists and is the
            # engine's view (the state of an accumulation's micro-batches).
            for m, o in ((plain, plain_opt), (hooked, opt)):
                micro(m)
                o.step()
            torch_s, depot_s = [], []
            for _ in range(args.rounds):
                torch_s.append(timed(plain, contextlib.nullcontext))
                depot_s.append(timed(hooked, opt.no_sync))
            opt.synchronize()
            opt.job.delete()
            opt.close()
    finally:
        server.stop()
    t, d = statistics.median(torch_s), statistics.median(depot_s)
    report = dict(bench="hooks", device=args.device, torch=torch.__version__,
                  tensors=len(list(plain.parameters())),
                  modules=sum(1 for mod in plain.modules()
                              if list(mod.parameters(recurse=False))),
                  attach=not args.no_attach,
                  delayed_update=args.delayed_update, rounds=args.rounds,
                  micro=args.micro, torch_micro_s=t, depot_micro_s=d,
                  hooks_s=d - t, ratio=d / t)
    print(f"{report['tensors']} tensors in {report['modules']} modules, "
          f"{args.device}: a micro-batch takes {t * 1e3:.3f} ms with torch, "
          f"{d * 1e3:.3f} ms with DepotOptimizer: the hooks "
          f"{(d - t) * 1e6:.0f} us ({d / t:.3f}x), medians of {args.rounds}")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
