#!/usr/bin/env python3
"""A GPT-style model's training step with DepotOptimizer against
torch.optim.AdamW on the GPU, in one run (issue 11's target: at least 350M
parameters in bf16, a depot-server on the same host; step time <= 1.10x
torch's fused AdamW, <= 1.02x with the delayed update, and the loss curve
within bf16 tolerance). tests/gpu/run.sh runs it on a GPU machine; CI runs it
on tiny sizes on the CPU (--device=cpu: the host engine) as a smoke check.

    tests/gpu/gpt_bench.py                      # GPT-2 medium size, ~355M
    tests/gpu/gpt_bench.py --device=cpu --layers=2 --d_model=64 ...   # smoke

Runs, on the same batches from the same initial weights:
  torch   torch.optim.AdamW(fused=True) (foreach=False on the CPU)
  depot   DepotOptimizer (the transfer engine; attach(model): forward waits
          per bucket)
  dpu     the same with delayed_update=True
With --offload_fraction < 1 the Depot runs keep the optimizer of the last
tensors on the GPU; with --checkpoint_every N the servers write periodic
checkpoints (and, with an offload fraction, wait for the engine's copy of the
kept state at each capture step), and the steps whose step() finished a
capture step are reported apart (capture_step_s): what a checkpoint costs
the trainer.
Each: --warmup steps, then --steps timed steps (the trainer's compute
stream synchronized at each step's end); the median step time. The loss curves are compared step by
step with torch's (the delayed update's is one step stale by design, so it is
reported, not held to the tolerance). Prints a table and, with --json, one
JSON line.
"""

import argparse
import json
import math
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import depot  # noqa: E402
import server_process  # noqa: E402
from depot.torch import DepotOptimizer  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            y = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True)
        else:  # torch < 2.0
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool,
                              device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads)
                                          for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d_model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--server", default=os.environ.get("DEPOT_SERVER"),
                        help="depot-server binary (default: $DEPOT_SERVER)")
    parser.add_argument("--servers", type=int, default=1,
                        help="depot-server processes on this host")
    parser.add_argument("--server_threads", type=int, default=None,
                        help="--threads of each server (default: the "
                             "host's cores divided among the servers)")
    parser.add_argument("--trainer_cores", type=int, default=0,
                        help="keep the trainer on the first N cores and "
                             "the servers on the others (0: no pinning)")
    parser.add_argument("--server_nice", type=int, default=0,
                        help="raise the servers' niceness by N (every "
                             "thread): their update threads then yield to "
                             "the trainer's on a shared host (0: as is)")
    parser.add_argument("--accum", type=int, default=1,
                        help="micro-batches of --batch per optimizer step "
                             "(gradient accumulation; Depot's in no_sync)")
    parser.add_argument("--streams_per_server", type=int, default=None,
                        help="the engine's Step streams per server")
    parser.add_argument("--slots", type=int, default=None,
                        help="the engine's pinned slots per ring")
    parser.add_argument("--max_inflight_chunks", type=int, default=None,
                        help="the client's chunks in flight per stream")
    parser.add_argument("--chunk_elems", type=int, default=None,
                        help="the job's chunk size (elements)")
    parser.add_argument("--offload_fraction", type=float, default=1.0,
                        help="DepotOptimizer's offload_fraction (the share "
                             "of parameters whose optimizer runs on the "
                             "servers; below 1 the rest stays on the GPU)")
    parser.add_argument("--checkpoint_every", type=int, default=0,
                        help="the servers' --checkpoint_every_steps (0: no "
                             "checkpoints), into a temporary directory")
    parser.add_argument("--checkpoint_keep", type=int, default=2,
                        help="the servers' --checkpoint_keep")
    parser.add_argument("--checkpoint_root", default=None,
                        help="where the servers' checkpoint directories go "
                             "(default: a temporary directory, removed at "
                             "the end)")
    parser.add_argument("--runs", default="torch,depot,dpu",
                        help="which runs, comma-separated")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check_depot_equals_torch", action="store_true",
                        help="fail unless the depot run's losses equal "
                             "torch's exactly (the CPU smoke check, fp32)")
    return parser.parse_args()


def renice(pid, increment):
    """Raises the niceness of every thread of process `pid` by `increment`.
    Linux keeps a niceness per thread, and a thread started later inherits
    its creator's, so the whole server runs at the new one."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        tid = int(tid)
        os.setpriority(os.PRIO_PROCESS, tid,
                       os.getpriority(os.PRIO_PROCESS, tid) + increment)


def sync(device):
    """The end of a step: the trainer's own (compute) stream has finished.
    Not the whole device: the engine's streams may still be moving this
    step's gradients, as in a training loop (with the delayed update they
    overlap the next step's compute); what the compute stream must wait for
    is counted in the step that waits."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class StepClock:
    """Where a step's time goes, on the trainer's compute stream: from the
    step's start to the end of its last backward (`compute`: forward and
    backward, and in a Depot run whatever the forward waited for, the
    weights of each bucket), and from there to the end of the step's work on
    that stream (`tail`: the optimizer's step as the stream sees it). Also
    the host's time inside opt.step() (`step_call`), which is not on the
    stream, and the host's time from the step's start to the return of its
    last backward (`host`: launching forward and backward, the hooks'
    Python included; when it nears `compute` the GPU waits for the thread
    that launches its kernels, and any host work the step adds shows in
    the step time). CUDA events on a GPU; on the CPU everything is synchronous and
    the host's clock is the stream's."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = {}

    def mark(self, what):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[what] = event
        else:
            self.marks[what] = time.perf_counter()

    def seconds(self, start, end):
        """After sync(): seconds between two marks."""
        if self.cuda:
            return self.marks[start].elapsed_time(self.marks[end]) / 1e3
        return self.marks[end] - self.marks[start]


def run(name, args, device, dtype, initial, batches, client):
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.d_model, args.layers, args.heads)
    model.load_state_dict(initial)
    model = model.to(device=device, dtype=dtype)
    if name == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                weight_decay=0.1,
                                **({"fused": True} if device.type == "cuda"
                                   else {"foreach": False}))
    else:
        engine_options = {}
        if args.streams_per_server is not None:
            engine_options["streams_per_server"] = args.streams_per_server
        if args.slots is not None:
            engine_options["d2h_slots"] = args.slots
            engine_options["h2d_slots"] = args.slots
        opt = DepotOptimizer(
            model.parameters(), client=client,
            job_name=f"gpt-bench-{name}-{os.getpid()}-{time.time_ns()}",
            engine=None if device.type == "cuda" else "host", lr=args.lr,
            weight_decay=0.1, delayed_update=(name == "dpu"),
            offload_fraction=args.offload_fraction,
            chunk_elems=args.chunk_elems,
            engine_options=engine_options or None)
        opt.attach(model)
    times, losses = [], []
    parts = {"compute": [], "tail": [], "step_call": [], "host": []}
    # The timed steps whose step() finished a step the servers captured
    # (with the delayed update, the step before), and the kept state's
    # chunks the run sent into the captures (the engine sends them behind
    # the steps, and reports each send with a later step, or when waited
    # for at the end).
    capture_times, capture_calls, capture_chunks = [], [], 0

    def count_capture(step, chunks, error):
        nonlocal capture_chunks
        if error:
            sys.exit(f"gpt_bench.py: the {name} run could not fill the "
                     f"servers' checkpoint of step {step}: {error}")
        capture_chunks += chunks
    clock = StepClock(device)
    for step in range(len(batches) // args.accum):
        start = time.perf_counter()
        clock.mark("start")
        opt.zero_grad()
        total = 0.0
        for micro in range(args.accum):
            x, y = batches[step * args.accum + micro]
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(
                logits.float().view(-1, args.vocab), y.view(-1))
            if args.accum > 1:
                loss = loss / args.accum
            if name != "torch" and micro < args.accum - 1:
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += loss.detach()
        loss = total
        clock.mark("backward")
        call = time.perf_counter()
        host = call - start
        opt.step()
        call = time.perf_counter() - call
        clock.mark("end")
        sync(device)
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        finished = getattr(opt, "last_result", None)
        if finished is not None:
            count_capture(finished.capture_step, finished.capture_chunks,
                          finished.capture_error)
        captured = (finished is not None and args.checkpoint_every > 0 and
                    finished.step % args.checkpoint_every == 0)
        if step >= args.warmup:
            if captured:
                capture_times.append(elapsed)
                capture_calls.append(call)
            times.append(elapsed)
            parts["compute"].append(clock.seconds("start", "backward"))
            parts["tail"].append(clock.seconds("backward", "end"))
            parts["step_call"].append(call)
            parts["host"].append(host)
    extra = {}
    if name != "torch":
        last = opt.engine.wait_captures()
        count_capture(last.step, last.chunks, last.error)
        before = opt.last_result
        opt.synchronize()  # the delayed update's last step
        if opt.last_result is not before:
            finished = opt.last_result
            count_capture(finished.capture_step, finished.capture_chunks,
                          finished.capture_error)
        extra["pinned_bytes"] = opt.engine.pinned_bytes
        opt.job.delete()
        opt.close()
    if capture_times:
        extra["capture_step_s"] = statistics.median(capture_times)
        extra["capture_step_call_s"] = statistics.median(capture_calls)
        extra["capture_steps"] = len(capture_times)
        extra["capture_chunks"] = capture_chunks
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for part, values in parts.items():
        extra[f"{part}_s"] = statistics.median(values)
    return dict(step_s=statistics.median(times), losses=losses, **extra)


def main():
    args = parse()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpt_bench.py: no CUDA device (torch.cuda.is_available() "
                 "is False); --device=cpu runs the smoke version")
    if not args.server:
        sys.exit("gpt_bench.py: name the depot-server binary with --server "
                 "or $DEPOT_SERVER")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(0)
    initial = GPT(args.vocab, args.seq, args.d_model, args.layers,
                  args.heads).state_dict()
    params = sum(v.numel() for k, v in initial.items())
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(args.vocab, (args.batch, args.seq),
                              generator=generator).to(device),
                torch.randint(args.vocab, (args.batch, args.seq),
                              generator=generator).to(device))
               for _ in range((args.warmup + args.steps) * args.accum)]
    cores = sorted(os.sched_getaffinity(0))
    trainer_cores, server_cores = cores, cores
    if args.trainer_cores:
        if not 0 < args.trainer_cores < len(cores):
            sys.exit(f"gpt_bench.py: --trainer_cores={args.trainer_cores} "
                     f"leaves no core to the servers ({len(cores)} cores)")
        trainer_cores = cores[:args.trainer_cores]
        server_cores = cores[args.trainer_cores:]
    if args.server_threads is None:
        args.server_threads = max(1, len(server_cores) // args.servers)
    servers = []
    client_options = {}
    if args.max_inflight_chunks is not None:
        client_options["max_inflight_chunks"] = args.max_inflight_chunks
    if args.streams_per_server is not None:
        client_options["connections_per_server"] = max(
            3, args.streams_per_server + 1)
    results = {}
    checkpoint_root = None
    if args.checkpoint_every:
        checkpoint_root = args.checkpoint_root or tempfile.mkdtemp(
            prefix="gpt-bench-checkpoints-")
    try:
        # The servers inherit this affinity; then the trainer's own (the
        # threads it starts later inherit that).
        os.sched_setaffinity(0, server_cores)
        for index in range(args.servers):
            flags = [f"--threads={args.server_threads}"]
            if checkpoint_root:
                flags += [f"--checkpoint_dir={checkpoint_root}/server-{index}",
                          f"--checkpoint_every_steps={args.checkpoint_every}",
                          f"--checkpoint_keep={args.checkpoint_keep}"]
            servers.append(server_process.start_server(args.server, flags))
            if args.server_nice:
                renice(servers[-1].process.pid, args.server_nice)
        os.sched_setaffinity(0, trainer_cores)
        # The trainer's process is its own: malloc tuned for transfers.
        with depot.Client([s.address for s in servers],
                          retain_transport_buffers=True,
                          **client_options) as client:
            client.wait_for_servers(60)
            for name in args.runs.split(","):
                results[name] = run(name, args, device, dtype, initial,
                                    batches, client)
    finally:
        for server in servers:
            server.stop()
        if checkpoint_root and not args.checkpoint_root:
            shutil.rmtree(checkpoint_root, ignore_errors=True)
    report = dict(bench="gpt", device=str(
        torch.cuda.get_device_name(device) if device.type == "cuda"
        else "cpu"), torch=torch.__version__, params=params,
        dtype=args.dtype, layers=args.layers, d_model=args.d_model,
        seq=args.seq, batch=args.batch, accum=args.accum,
        tokens_per_step=args.batch * args.seq * args.accum,
        steps=args.steps, servers=args.servers,
        trainer_cores=args.trainer_cores, server_nice=args.server_nice,
        server_threads=args.server_threads,
        streams_per_server=args.streams_per_server, slots=args.slots,
        max_inflight_chunks=args.max_inflight_chunks,
        chunk_elems=args.chunk_elems, offload_fraction=args.offload_fraction,
        checkpoint_every=args.checkpoint_every)
    reference = results.get("torch")
    for name, result in results.items():
        report[f"{name}_step_s"] = result["step_s"]
        if "pinned_bytes" in result:
            report[f"{name}_pinned_bytes"] = result["pinned_bytes"]
        for part in ("compute", "tail", "step_call", "host"):
            report[f"{name}_{part}_s"] = result[f"{part}_s"]
        for key in ("capture_step_s", "capture_step_call_s", "capture_steps",
                    "capture_chunks"):
            if key in result:
                report[f"{name}_{key}"] = result[key]
        if reference and name != "torch":
            report[f"{name}_ratio"] = result["step_s"] / reference["step_s"]
            report[f"{name}_max_loss_rel_diff"] = max(
                abs(a - b) / abs(b) for a, b in
                zip(result["losses"], reference["losses"]))
        report[f"{name}_losses"] = result["losses"]
    print(f"GPT {params / 1e6:.0f}M parameters, {args.dtype}, "
          f"batch {args.batch}x{args.seq} x{args.accum} accumulated, "
          f"{args.servers} server(s), {report['device']}, "
          f"median of {args.steps} steps" +
          (f", offload fraction {args.offload_fraction:g}"
           if args.offload_fraction < 1 else "") +
          (f", a checkpoint every {args.checkpoint_every} steps"
           if args.checkpoint_every else ""))
    print(f"{'run':8} {'step s':>10} {'x torch':>9} {'target':>7} "
          f"{'max loss rel diff':>18} {'compute s':>10} {'tail s':>8} "
          f"{'step() s':>9} {'host s':>8}" +
          (f" {'capture step s':>15}" if args.checkpoint_every else ""))
    targets = {"depot": "1.10", "dpu": "1.02"}
    for name in results:
        ratio = report.get(f"{name}_ratio")
        diff = report.get(f"{name}_max_loss_rel_diff")
        capture = report.get(f"{name}_capture_step_s")
        capture = "" if capture is None else f"{capture:.4f}"
        print(f"{name:8} {report[f'{name}_step_s']:10.4f} "
              f"{'' if ratio is None else f'{ratio:.3f}':>9} "
              f"{targets.get(name, ''):>7} "
              f"{'' if diff is None else f'{diff:.2e}':>18} "
              f"{report[f'{name}_compute_s']:10.4f} "
              f"{report[f'{name}_tail_s']:8.4f} "
              f"{report[f'{name}_step_call_s']:9.4f} "
              f"{report[f'{name}_host_s']:8.4f}" +
              (f" {capture:>15}" if args.checkpoint_every else ""))
    if args.json:
        print(json.dumps(report))
    for name, result in results.items():
        if not all(math.isfinite(v) for v in result["losses"]):
            sys.exit(f"gpt_bench.py: the {name} run's loss is not finite")
    for name, result in results.items():
        if name != "torch" and args.offload_fraction < 1 and \
                result.get("capture_steps") and not result["capture_chunks"]:
            sys.exit(f"gpt_bench.py: the {name} run's capture steps sent "
                     f"none of the kept state to the servers' checkpoints")
    if args.check_depot_equals_torch and \
            results["depot"]["losses"] != results["torch"]["losses"]:
        sys.exit("gpt_bench.py: the depot run's losses differ from torch's: "
                 f"{results['depot']['losses']} vs "
                 f"{results['torch']['losses']}")


if __name__ == "__main__":
    main()
