"""DepotOptimizer on CUDA parameters (docs/gpu.md, "PyTorch on GPUs"):
the CUDA engine through libdepot_cuda.so, torch's current stream, hooks
inside backward, real depot-server processes. Skips, saying why, without a
CUDA device (CI, the development machines); tests/gpu/run.sh runs it on a
GPU machine.

Bit-for-bit comparisons use a model whose gradients are exact on any device
(loss = sum(p * c): the gradient of p is c), so that the GPU's and the host's
runs differ only in what Depot does with them.
"""

import copy
import pathlib
import sys
import time

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] /
                       "python"))
from conftest import client, job_name, servers  # noqa: E402,F401 (fixtures)

import depot  # noqa: E402
from depot.torch import DepotOptimizer  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip(f"no CUDA device: torch {torch.__version__} sees none "
                f"(torch.cuda.is_available() is False)",
                allow_module_level=True)

STEPS = 6


class Exact(torch.nn.Module):
    """Parameters of several sizes; loss = sum over them of (p * c).sum()
    with fixed c, so p.grad == c exactly."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        sizes = [(64, 33), (33,), (17, 8), (5,), (300,)]
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(s).to(dtype)) for s in sizes])
        self.cs = [torch.randn(s).to(dtype) for s in sizes]

    def forward(self, step):
        return sum(((p * (c.to(p.device) * (1 + step % 3))).sum()
                    for p, c in zip(self.ps, self.cs)))


def bits(t):
    t = t.detach().cpu()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def run(model, opt, steps=STEPS):
    for s in range(steps):
        opt.zero_grad()
        model(s).backward()
        opt.step()
    opt.synchronize()
    return [p.detach().cpu().clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delayed", [False, True])
def test_cuda_engine_equals_the_host_engine(client, job_name, dtype, delayed):
    host = Exact(dtype)
    gpu = copy.deepcopy(host).cuda()
    kwargs = dict(client=client, lr=1e-2, weight_decay=0.1, chunk_elems=256,
                  bucket_chunks=1, delayed_update=delayed)
    want = run(host, DepotOptimizer(host.parameters(),
                                    job_name=f"{job_name}-host",
                                    engine="host", **kwargs))
    opt = DepotOptimizer(gpu.parameters(), job_name=job_name, **kwargs)
    assert opt.engine.device == "cuda"
    got = run(gpu, opt)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(bits(g), bits(w)), f"parameter {i}"
    opt.close()


@pytest.mark.parametrize("clip_grad", [0.0, 1.0])
def test_cuda_offload_fraction_equals_full_offload(client, job_name,
                                                   clip_grad):
    """Also clipped (two-phase steps: the servers sum the kept parameters'
    gradients and send the sums with their decision)."""
    results = []
    for fraction in (1.0, 0.5):
        model = Exact(torch.float32).cuda()
        opt = DepotOptimizer(model.parameters(), client=client,
                             job_name=f"{job_name}-{fraction}", lr=1e-2,
                             weight_decay=0.1, offload_fraction=fraction,
                             clip_grad=clip_grad, chunk_elems=256,
                             bucket_chunks=1)
        results.append(run(model, opt))
        if clip_grad:
            assert opt.last_result.clip_coef < 1  # the steps clip
        opt.close()
    for i, (g, w) in enumerate(zip(results[1], results[0])):
        assert torch.equal(bits(g), bits(w)), f"parameter {i}"


def kept_half_on_the_device(client, job_name):
    """An Exact fp32 model on the GPU and its DepotOptimizer with
    offload_fraction 0.5 (some parameters' optimizer on the device)."""
    model = Exact(torch.float32).cuda()
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-2, weight_decay=0.1,
                         offload_fraction=0.5, chunk_elems=256,
                         bucket_chunks=1)
    assert opt.engine.device_tensors
    return model, opt


def test_cuda_reference_holds_the_kept_state(tmp_path, job_name):
    """offload_fraction 0.5 on CUDA: state_dict(reference=True) writes the
    kept parameters' state from the device into the servers' arrays
    (StoreGpuState through the CUDA device's copies) before they
    checkpoint, and loading it reads it back onto the device: three steps
    after the reference, repeated after the load, end bit for bit alike."""
    import server_process
    from conftest import server_binary
    started = [server_process.start_server(
        server_binary(), [f"--checkpoint_dir={tmp_path / f'server-{s}'}",
                          "--threads=2"]) for s in range(2)]
    try:
        with depot.Client([s.address for s in started]) as c:
            model, opt = kept_half_on_the_device(c, job_name)
            run(model, opt, steps=3)
            reference = opt.state_dict(reference=True)
            after = run(model, opt, steps=3)
            opt.load_state_dict(reference)
            again = run(model, opt, steps=3)
            for i, (g, w) in enumerate(zip(again, after)):
                assert torch.equal(bits(g), bits(w)), f"parameter {i}"
            opt.close()
    finally:
        for server in started:
            server.stop()


def test_cuda_periodic_checkpoint_holds_the_kept_state(tmp_path, job_name):
    """offload_fraction 0.5 on CUDA with the servers checkpointing every 4
    steps: the engine copies the kept state of step 4 from the device on its
    comm stream and sends it into the servers' capture (last_capture), so
    that the checkpoint of step 4 holds it. Both servers killed and
    restarted after step 7: the next step goes back to 4 by itself
    (RolledBackError, the kept state read back onto the device), and three
    steps from there end bit for bit like the three after it the first
    time."""
    from test_rollback import EVERY, checkpointing_servers, restart
    with checkpointing_servers(tmp_path) as (servers, dirs):
        addresses = [s.address for s in servers]
        with depot.Client(addresses, unavailable_retry=20) as c:
            model, opt = kept_half_on_the_device(c, job_name)
            run(model, opt, steps=EVERY)
            report = opt.last_capture  # run's synchronize() waited for it
            assert (report.step, report.error) == (EVERY, "")
            assert report.chunks > 0
            at_every = [p.detach().cpu().clone() for p in model.parameters()]
            after = run(model, opt, steps=3)
            deadline = time.monotonic() + 30
            while opt.job.newest_checkpoint_with_worker_state(EVERY + 3) \
                    != EVERY:
                assert time.monotonic() < deadline, "no whole checkpoint"
                time.sleep(0.05)
            for s in range(2):
                restart(servers, dirs, addresses, s)
            with pytest.raises(depot.RolledBackError) as rolled:
                run(model, opt, steps=1)
            assert rolled.value.step == EVERY
            for p, w in zip(model.parameters(), at_every):
                assert torch.equal(bits(p), bits(w))
            again = run(model, opt, steps=3)
            for i, (g, w) in enumerate(zip(again, after)):
                assert torch.equal(bits(g), bits(w)), f"parameter {i}"
            opt.close()


def test_cuda_training_follows_torch_adamw(client, job_name):
    """A small MLP on the GPU: the loss curve of DepotOptimizer (fp32 masters
    on the servers) against torch.optim.AdamW(fused=True) on the GPU, within
    1e-4 relative (different hardware rounds matmuls differently)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).cuda()
    reference = copy.deepcopy(model)
    opt = DepotOptimizer(model.parameters(), client=client,
                         job_name=job_name, lr=1e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3,
                                weight_decay=0.1, fused=True)
    data = [(torch.randn(32, 64, device="cuda"),
             torch.randn(32, 64, device="cuda")) for _ in range(20)]
    losses = []
    for m, o in ((model, opt), (reference, ref_opt)):
        curve = []
        for x, y in data:
            o.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            o.step()
            curve.append(loss.item())
        losses.append(curve)
    for s, (a, b) in enumerate(zip(*losses)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {s}: {a} vs {b}"
    opt.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_cuda_gradients_clipped_after_backward(client, job_name, overlap):
    """clip_grad_norm_ after backward: with the overlap, step() raises (the
    buckets left during backward; the version counter of the CUDA gradient
    buffer sees the change); with overlap_backward=False the clipped
    gradients are sent, equal to the host engine's run of the same loop."""
    def clipped_run(model, opt):
        for s in range(STEPS):
            opt.zero_grad()
            model(s).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        opt.synchronize()
        return [p.detach().cpu().clone() for p in model.parameters()]

    gpu = Exact(torch.float32).cuda()
    kwargs = dict(client=client, lr=1e-2, chunk_elems=256, bucket_chunks=1,
                  overlap_backward=overlap)
    opt = DepotOptimizer(gpu.parameters(), job_name=job_name, **kwargs)
    if overlap:
        with pytest.raises(RuntimeError, match="changed in place"):
            clipped_run(gpu, opt)
    else:
        host = Exact(torch.float32)
        host_opt = DepotOptimizer(host.parameters(),
                                  job_name=f"{job_name}-host",
                                  engine="host", **kwargs)
        want = clipped_run(host, host_opt)
        host_opt.close()
        got = clipped_run(gpu, opt)
        for i, (g, w) in enumerate(zip(got, want)):
            # clip_grad_norm_'s norm is computed on each device: equal
            # within its rounding, not bit for bit.
            assert torch.allclose(g, w, rtol=1e-6, atol=1e-7), \
                f"parameter {i}"
    opt.close()
