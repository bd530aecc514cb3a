"""DepotOptimizer's engine mode (docs/gpu.md, "PyTorch on GPUs"): the
parameters' gradients and weights are views into a depot.Engine's flat
buffers, each bucket's gradients leave from inside backward, and the updated
weights come back into the parameters' own storage.

One _EngineDriver per DepotOptimizer; it owns the depot.Engine, the views and
the autograd hooks. The rules it keeps (each one tested in
tests/python/test_torch_engine.py over the host engine):

- A parameter's .grad is a view into the engine's gradient buffer. Autograd
  accumulates into an existing .grad in place; a fresh .grad (after
  zero_grad(set_to_none=True)) is copied into the view by the hook, and
  .grad becomes the view again.
- The hook runs after a parameter's gradient is accumulated
  (register_post_accumulate_grad_hook on torch >= 2.1; before that, a hook on
  the parameter's AccumulateGrad node). A bucket is handed to the engine once
  every parameter with requires_grad (as it is when the step begins) that
  overlaps it has fired; the first hook of a backward begins the step, with
  this step's lr, weight decay and loss scale, and the parameters without
  requires_grad and without a .grad as the ones without a gradient (a frozen
  parameter that kept a zero .grad, zero_grad(set_to_none=False), is stepped
  with it, as torch does). Buckets nobody fired for go at step().
- A parameter with requires_grad that gets no gradient in a backward cannot
  be declared after its step began: with find_unused_parameters=True (DDP's
  name) the step begins only at step(), when every .grad is known (the
  transfers then overlap nothing of backward); without it, such a step
  completes with that gradient as zeros and step() raises RuntimeError
  naming the parameters (torch.optim would have skipped them).
- A hook that fires twice in one step (several backwards before step())
  raises, unless inside `with optimizer.no_sync():`, where hooks only
  accumulate.
- Gradients changed between backward and step() (clip_grad_norm_,
  GradScaler.unscale_, any in-place edit of a .grad, or a .grad replaced)
  cannot reach a bucket that already left: the gradient buffer's version
  counter (shared by every view) and the .grad objects are checked at
  step(), which completes the step (some buckets with the change, some
  without) and raises RuntimeError naming the remedies. The same for a
  group's lr or weight_decay changed after backward began the step (they
  leave with it, during backward). With
  overlap_backward=False the step begins at step() instead, and such
  changes are sent.
- Weights changed outside the optimizer (in-place edits, load_state_dict of
  the model, p.data reassigned) are noticed by the parameters' version
  counters and storage: that step runs as a plain Depot step with the new
  values as master weights (no overlap), then the engine resumes. With the
  delayed update, an offload fraction or a node of several ranks this is
  refused (RuntimeError), as it cannot be done exactly there.
- A node of several local ranks whose step failed on one rank (a server it
  sends to restarted) rolls back on every rank (_recover_node): the rank
  that failed at step(), the others when their next step would begin (the
  node's verdict, Engine.check_node; recorded in backward's hook, raised at
  step()) or at synchronize(). Every rank raises RolledBackError with the
  same step (docs/gpu.md, "A rank's failure on a node").
"""

import contextlib
import ctypes

import torch

import depot

from depot.engine import Engine

_HAS_POST_ACCUMULATE_HOOK = hasattr(torch.Tensor,
                                    "register_post_accumulate_grad_hook")


def _view(address, elems, dtype, device):
    """A tensor of `elems` elements of `dtype` at `address` (host memory for
    the host engine, device memory on CUDA), not owning it: the engine keeps
    the memory until it is closed."""
    if elems == 0:
        return torch.zeros(0, dtype=dtype, device=device)
    size = torch.tensor([], dtype=dtype).element_size()
    if device.type == "cpu":
        raw = (ctypes.c_byte * (elems * size)).from_address(address)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype)
    # bf16 has no typestr: the interface describes integers of its size.
    typestr = {1: "|u1", 2: "<i2", 4: "<i4"}[size]
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]

    class _Interface:
        __cuda_array_interface__ = {
            "shape": (elems,), "typestr": typestr,
            "data": (address, False), "version": 2, "strides": None,
            "stream": None}

    return torch.as_tensor(_Interface(), dtype=int_dtype,
                           device=device).view(dtype)


class _EngineDriver:
    def __init__(self, optimizer, job, device, engine_kwargs,
                 find_unused_parameters, overlap_backward=True):
        self.opt = optimizer
        self.job = job
        self.device = device
        self.find_unused = bool(find_unused_parameters)
        # The step begins at step(), not in backward's first hook: every
        # .grad is known then (find_unused_parameters), or the trainer
        # changes gradients after backward (overlap_backward=False).
        self.begin_at_step = self.find_unused or not overlap_backward
        self.engine = Engine(job, "host" if device.type == "cpu" else "cuda",
                             cuda_device=(device.index or 0)
                             if device.type == "cuda" else 0,
                             **engine_kwargs)
        self.delayed = self.engine.delayed_update
        self.local_ranks = engine_kwargs.get("local_ranks", 1)
        self.local_rank = engine_kwargs.get("local_rank", 0)
        self.offloads_all = not self.engine.device_tensors
        # A job that has applied steps (resume=True): the optimizer state of
        # the parameters kept on the device died with the trainer that held
        # it. The servers' arrays hold it when they were restored from a
        # checkpoint that holds it (a periodic one the engine filled, or a
        # reference's): it is read back from there (on a node, a collective:
        # every rank constructs its optimizer at once). Else no step runs
        # until load_state_dict() brings it back (the engine refuses too).
        self.kept_state_missing = not self.offloads_all and any(
            status.step > 0 for status in job.status())
        if self.kept_state_missing:
            try:
                self.engine.restore_device_state()
                self.kept_state_missing = False
            except (depot.FailedPreconditionError, depot.AbortedError):
                pass  # step() says why
        params = optimizer._params
        self.params = params
        self.slots = optimizer._slots
        grad_dtype = params[0].dtype
        n = self.engine.padded_elems
        self.weights = _view(self.engine.weights_address(), n, grad_dtype,
                             device)
        # The buffers of the steps' gradients (one; two with the delayed
        # update, by the step's parity).
        self.grad_buffers = {}
        for parity in ((1, 2) if self.delayed else (1,)):
            buffer = _view(self.engine.grads_address(parity), n, grad_dtype,
                           device)
            buffer.zero_()
            self.grad_buffers[parity % 2 if self.delayed else 0] = buffer
        # Each parameter's .grad view into each buffer, made once: the hooks
        # run for every parameter in every backward (every micro-batch of an
        # accumulation), and slicing anew there was most of their cost.
        self.grad_views = {
            key: [buffer[offset:offset + numel].view_as(p)
                  for p, offset, numel in self.slots]
            for key, buffer in self.grad_buffers.items()}
        # Every parameter's storage becomes its slice of the weights buffer.
        with torch.no_grad():
            for p, offset, numel in self.slots:
                view = self.weights[offset:offset + numel].view_as(p)
                view.copy_(p.detach())
                p.data = view
        # Buckets: which parameters (with requires_grad) each waits for.
        self.buckets_of = []
        ranges = self.engine.bucket_ranges
        for p, offset, numel in self.slots:
            end = offset + numel
            self.buckets_of.append(
                [b for b, (lo, hi) in enumerate(ranges)
                 if lo < end and offset < hi] if numel else [])
        self.step = optimizer._depot_step + 1  # the step backward feeds
        self.in_flight = []  # steps begun and not finished
        self.hooks = []
        self.hooked = set()  # indices of the parameters with a hook
        self.no_sync_depth = 0
        # attach(): buckets whose weights forward has not waited for yet.
        self.attached = False
        self.pending_waits = set()
        self.module_hooks = []
        self._reset_step_state()
        self._point_grads(self.step, copy_current=False)
        self._remember_weights()

    # -- views and hooks -------------------------------------------------

    def _grad_buffer(self, step):
        return self.grad_buffers[step % 2 if self.delayed else 0]

    def _grad_view(self, index, step):
        return self.grad_views[step % 2 if self.delayed else 0][index]

    def _point_grads(self, step, copy_current):
        """Points every parameter's .grad at step `step`'s buffer (keeping
        its values when copy_current; None stays None)."""
        with torch.no_grad():
            for index, p in enumerate(self.params):
                view = self._grad_view(index, step)
                if p.grad is None:
                    continue
                if p.grad.data_ptr() != view.data_ptr():
                    if copy_current:
                        view.copy_(p.grad)
                    p.grad = view

    def _register_hook(self, index, p):
        views = self.grad_views

        def fire(*unused):
            # The hook of every micro-batch but the last of an accumulation:
            # autograd accumulated into the view in place and there is
            # nothing else to do, in one frame (it runs on the thread that
            # launches backward's kernels).
            if self.no_sync_depth > 0 and p.grad is views[
                    self.step % 2 if self.delayed else 0][index]:
                return
            self._on_gradient(index)
        if _HAS_POST_ACCUMULATE_HOOK:
            self.hooks.append(p.register_post_accumulate_grad_hook(fire))
        else:
            # The AccumulateGrad node of the parameter (as DDP finds it);
            # its hook runs after the gradient is accumulated into .grad.
            # (step() runs under no_grad, where expand_as makes no node.)
            with torch.enable_grad():
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self.hooks.append((accumulator,
                               accumulator.register_hook(fire)))
        self.hooked.add(index)

    def _ensure_hooks(self):
        """A hook for every parameter with requires_grad (one without it
        cannot have one: unfrozen later, it gets its hook at the end of the
        next step, outside backward)."""
        for index, p in enumerate(self.params):
            if p.requires_grad and index not in self.hooked:
                self._register_hook(index, p)

    def remove_hooks(self):
        for hook in self.hooks:
            (hook[1] if isinstance(hook, tuple) else hook).remove()
        self.hooks = []
        self.hooked = set()

    def _stream(self):
        if self.device.type != "cuda":
            return 0
        return torch.cuda.current_stream(self.device).cuda_stream

    def _reset_step_state(self):
        self.fired = [False] * len(self.params)
        self.waiting = None  # counted when the step begins (_begin)
        self.named = [False] * len(self.engine.bucket_ranges)
        self.begun = False
        self.plain = False  # this step runs as a plain Depot step
        self.declared_no_grad = None
        self.grad_version = None  # the buffer's after backward's last hook
        self.begun_hparams = None  # each group's lr and weight decay sent
        # This step begins at step(): a parameter unfrozen since the last
        # step has no hook yet, so backward cannot tell when its buckets are
        # whole, nor when its gradient stopped changing.
        self.begin_late = False
        # A node of several local ranks: the error saying an earlier step
        # failed on another rank, found when this step was to begin in
        # backward; step() recovers (_recover_node).
        self.node_failure = None
        self._ensure_hooks()

    def _foreign_grad(self, index):
        """Parameter `index`'s .grad when it is not its view (a fresh one
        autograd made, or one the trainer assigned), else None."""
        grad = self.params[index].grad
        view = self._grad_view(index, self.step)
        if grad is None or grad is view:  # autograd accumulated in place
            return None
        return grad if grad.data_ptr() != view.data_ptr() else None

    def _adopt_grad(self, index):
        """Makes parameter `index`'s .grad the view (copying a fresh one)."""
        grad = self._foreign_grad(index)
        if grad is not None:
            view = self._grad_view(index, self.step)
            with torch.no_grad():
                view.copy_(grad)
            self.params[index].grad = view

    def _on_gradient(self, index):
        self._adopt_grad(index)
        if self.no_sync_depth > 0:
            return
        if self.fired[index]:
            raise RuntimeError(
                f"DepotOptimizer: parameter {index} received a second "
                f"gradient before step(): its bucket already left during the "
                f"first backward. To accumulate gradients over several "
                f"backwards, run all but the last inside "
                f"`with optimizer.no_sync():`")
        self.fired[index] = True
        if self.kept_state_missing:
            return  # step() says why
        if self.begin_at_step or self.begin_late or self.plain:
            return
        if not self.begun:
            if self._weights_edited():
                self.plain = True
                return
            if any(p.requires_grad and i not in self.hooked
                   for i, p in enumerate(self.params)):
                self.begin_late = True
                return
            # A parameter without requires_grad gets no gradient in this
            # backward: its .grad now is its gradient for the step (None, or
            # kept by zero_grad(set_to_none=False): torch steps it then).
            for i, p in enumerate(self.params):
                if not p.requires_grad:
                    self._adopt_grad(i)
            self.node_failure = self._node_failure()
            if self.node_failure is not None:
                # Not raised inside backward: step() recovers.
                self.begin_late = True
                return
            self._begin(no_grad=[i for i, p in enumerate(self.params)
                                 if not p.requires_grad and p.grad is None])
        for b in self.buckets_of[index]:
            self.waiting[b] -= 1
            if self.waiting[b] == 0:
                self._name(b)
        # What backward left in the buffer; step() compares (a change after
        # this may not reach a bucket that has left).
        self.grad_version = self._grad_buffer(self.step)._version

    def _name(self, bucket):
        self.named[bucket] = True
        self._gradients_ready(bucket, self._stream())

    def _gradients_ready(self, bucket, stream):
        """Engine.gradients_ready. A step that failed already (a server went
        away under it while backward still ran) refuses to name more
        buckets with its own error: when a server restart may explain it,
        it is left to finish_step, which reports it, and step() recovers,
        rather than raised from inside backward, where nothing would."""
        try:
            self.engine.gradients_ready(bucket, stream)
        except depot.DepotError as error:
            if not _restart_may_explain(error):
                raise

    def _begin(self, no_grad):
        opt = self.opt
        self.wait_pending()
        if self.delayed and len(self.in_flight) == 2:
            raise RuntimeError("DepotOptimizer: two steps are in flight; "
                               "call step() after each backward")
        self.declared_no_grad = set(no_grad)
        # Which parameters each bucket waits for: those that get a gradient
        # in this backward (requires_grad now: the trainer may have frozen or
        # unfrozen some since the last step).
        self.waiting = [0] * len(self.engine.bucket_ranges)
        for index, p in enumerate(self.params):
            if p.requires_grad:
                for b in self.buckets_of[index]:
                    self.waiting[b] += 1
        self.begun_hparams = opt._group_hparams()
        self.engine.begin_step(
            self.step, group_hparams=self.begun_hparams,
            loss_scale=opt._grad_scaler().scale, no_grad_tensors=no_grad)
        self.in_flight.append((self.step, opt._grad_scaler().scale))
        self.begun = True

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_depth += 1
        try:
            yield
        finally:
            self.no_sync_depth -= 1

    # -- weights edited outside the optimizer ----------------------------

    def _remember_weights(self):
        self.versions = [p._version for p in self.params]
        self.pointers = [p.data_ptr() for p in self.params]

    def _edited_indices(self):
        out = []
        for index, (p, offset, numel) in enumerate(self.slots):
            expected = self.weights[offset:offset + numel].data_ptr() \
                if numel else p.data_ptr()
            if p._version != self.versions[index] or \
                    p.data_ptr() != expected or p.data_ptr() != \
                    self.pointers[index]:
                out.append(index)
        return out

    def _weights_edited(self):
        edited = self._edited_indices()
        if not edited and not self.opt._sync_all:
            return False
        blocker = ("the delayed update" if self.delayed else
                   "an offload fraction" if not self.offloads_all else
                   "a node of several local ranks" if self.local_ranks > 1
                   else None)
        if blocker is not None:
            raise RuntimeError(
                f"DepotOptimizer: parameter(s) {edited[:8]} changed outside "
                f"the optimizer since the last step. With {blocker} the "
                f"engine cannot take new master weights: change weights "
                f"only through the optimizer (or load_state_dict of the "
                f"optimizer), or run without that option")
        return True

    # -- step() ----------------------------------------------------------

    def run_step(self):
        """DepotOptimizer.step() in engine mode; returns the StepResult of
        the step that finished (None with the delayed update's first step)."""
        opt = self.opt
        self.wait_pending()
        if self.no_sync_depth > 0:
            raise RuntimeError("DepotOptimizer.step() inside no_sync()")
        if self.kept_state_missing:
            self._reset_step_state()
            raise depot.FailedPreconditionError(
                "DepotOptimizer.step(): the job has applied steps (resume="
                "True) and this optimizer keeps some parameters' optimizer "
                "state on the device (offload_fraction < 1), which died "
                "with the trainer that held it, and the servers' arrays do "
                "not hold it at their step (they were not restored from a "
                "checkpoint that holds it, or on a node another local rank "
                "could not read its part back): load a state_dict() saved "
                "by value, or a reference (state_dict(reference=True)), "
                "with load_state_dict() first")
        if self.node_failure is not None:
            self._recover_node(self.node_failure)
        if not self.begun and not self.plain and self._weights_edited():
            self.plain = True
        late = self._changed_after_backward() if self.begun else None
        sent_hparams, now_hparams = self.begun_hparams, opt._group_hparams()
        hparams_late = self.begun and now_hparams != sent_hparams
        for index in range(len(self.params)):
            self._adopt_grad(index)
        no_grad = [i for i, p in enumerate(self.params) if p.grad is None]
        if self.plain:
            result = self._plain_step(no_grad)
            self._after_step()
            return result
        surprises = []
        if self.begun:
            surprises = sorted(set(no_grad) ^ self.declared_no_grad)
        else:
            failure = self._node_failure()
            if failure is not None:
                self._recover_node(failure)
            self._begin(no_grad)
        buffer = self._grad_buffer(self.step)
        with torch.no_grad():
            for index in sorted(self.declared_no_grad):
                p, offset, numel = self.slots[index]
                if p.grad is None:
                    buffer[offset:offset + numel].zero_()
            for index in surprises:
                p, offset, numel = self.slots[index]
                if p.grad is None:  # declared with a gradient: zeros
                    buffer[offset:offset + numel].zero_()
        for b in range(len(self.named)):
            if not self.named[b]:
                self._name(b)
        result = None
        if not self.delayed or len(self.in_flight) == 2:
            result = self._finish_one()
        self._after_step()
        if hparams_late:
            raise RuntimeError(
                f"DepotOptimizer: a param group's lr or weight_decay changed "
                f"after backward began the step (its values leave with the "
                f"first bucket, during backward), so step {self.step - 1} "
                f"was applied with the values backward saw: "
                f"{[(lr, wd) for _, lr, wd in sent_hparams]} (lr, "
                f"weight_decay per group), not "
                f"{[(lr, wd) for _, lr, wd in now_hparams]}. "
                f"Set them before backward (an LR scheduler stepped after "
                f"optimizer.step() does), or pass overlap_backward=False so "
                f"that the step begins at step()")
        if late:
            raise RuntimeError(
                f"DepotOptimizer: the gradients changed after backward had "
                f"handed them to the engine ({late}). Each bucket leaves "
                f"during backward, so step {self.step - 1} was applied with "
                f"gradients of which only some had that change (those of "
                f"buckets still in this process when it was made). "
                f"Use the optimizer's clip_grad= (the servers clip the summed "
                f"gradient as clip_grad_norm_ would) and loss_scale= instead "
                f"of clip_grad_norm_ and GradScaler, or pass "
                f"overlap_backward=False so that the gradients leave at "
                f"step() and changes made before it are sent")
        if surprises:
            raise RuntimeError(
                f"DepotOptimizer: parameter(s) {surprises[:8]} had a "
                f"gradient that differed from what the step declared when it began during backward (a "
                f"parameter with requires_grad that received no gradient, "
                f"or one without requires_grad that got one). The step was "
                f"applied with a missing gradient as zeros, where "
                f"torch.optim would have skipped the parameter. Pass "
                f"find_unused_parameters=True when some parameters may get "
                f"no gradient (the step then begins at step())")
        return result

    def _changed_after_backward(self):
        """How the gradients changed since backward's last hook of a step that
        began in backward (None: they did not): in place (the buffer's
        version counter, shared by every .grad view), or .grad replaced by
        another tensor."""
        if self._grad_buffer(self.step)._version != self.grad_version:
            return ("changed in place, as clip_grad_norm_, "
                    "GradScaler.unscale_ or p.grad.mul_() do")
        replaced = [index for index in range(len(self.params))
                    if self._foreign_grad(index) is not None]
        if replaced:
            return f".grad replaced for parameter(s) {replaced[:8]}"
        return None

    def _finish_one(self):
        step, scale = self.in_flight.pop(0)
        try:
            result = self.engine.finish_step()
        except depot.DepotError as error:
            if not _restart_may_explain(error):
                raise
            result = self._recover(step, scale, error)
        self.opt._record_result(step, result, scale)
        return result

    def _recover(self, step, scale, error):
        """Step `step` failed in a way a server restart explains (as
        depot.Job.step recovers, docs/checkpoints.md "Rolling back"): makes
        the servers agree again (Job.reconcile), then sends the step again
        from the gradients still in the engine's buffer when every server is
        at step - 1 or has applied it (the servers replay an applied step:
        nothing is applied twice); otherwise, and always with the delayed
        update (whose next step's gradient was computed from weights the
        servers no longer agree on), the parameters take the servers'
        weights and RolledBackError names the step to resume from."""
        if self.local_ranks > 1:
            self._recover_node(error)
        for _ in range(_RECOVERY_ROUNDS):
            # With the delayed update a second step may be in flight: its
            # outcome no longer counts.
            self._drain_in_flight()
            at = self._reconcile(error)
            if not self.offloads_all:
                # The state kept on the device cannot replay a step: always a
                # rollback, to a checkpoint that holds that state too.
                target = self._back_to_whole_checkpoint(at, error)
                self._roll_back(
                    target, f"step {step} failed: {error.message}; the "
                            f"optimizer state kept on the device went back "
                            f"with the servers to their checkpoint of step "
                            f"{target}, which holds it")
            if self.delayed or at + 1 < step:
                self._roll_back(at, f"step {step} failed: {error.message}")
            self.engine.begin_step(
                step, group_hparams=self.opt._group_hparams(),
                loss_scale=scale,
                no_grad_tensors=sorted(self.declared_no_grad))
            stream = self._stream()
            for b in range(len(self.engine.bucket_ranges)):
                self._gradients_ready(b, stream)
            try:
                return self.engine.finish_step()
            except depot.DepotError as again:
                if not _restart_may_explain(again):
                    raise
                error = again
        raise error

    def _back_to_whole_checkpoint(self, at, error):
        """Parameters kept on the device, the servers agreeing on step `at`
        after a failed step (`error`; on a node of several local ranks,
        every rank here after the node's reconcile): takes the job back to
        the newest step at or before `at` whose checkpoint holds the kept
        state on every server: one this optimizer made whole
        (state_dict(reference=True) or checkpoint() stored the kept state
        into the servers' arrays before they wrote it: opt._whole_steps),
        or a periodic one the engine filled (the servers say which:
        Job.newest_checkpoint_with_worker_state). On a node the ranks
        agree on the least of their answers (Engine.agree_on_step: a
        checkpoint written between two ranks' questions can change the
        answer) and local rank 0 rolls back. Then the kept state is read
        back (on a node, each rank its part, a collective) and the step
        returned. Without such a step, or when going back to it fails,
        raises `error` naming the remedy (on every rank of a node)."""
        whole = [s for s in self.opt._whole_steps if s <= at]
        try:
            filled = self.job.newest_checkpoint_with_worker_state(at)
        except depot.DepotError:
            filled = None
        if filled is not None:
            whole.append(filled)
        # Step 0 has no checkpoint: it stands for "none".
        target = self.engine.agree_on_step(max(whole, default=0))
        if target == 0:
            self._refuse_recovery_with_kept_state(error)
        failed = None
        if self.local_rank == 0:
            try:
                self.job.roll_back(target)
            except depot.DepotError as e:
                failed = e
        # Every rank learns whether rank 0 rolled back (after it has).
        if self.engine.agree_on_step(0 if failed else 1) == 0:
            self._refuse_recovery_with_kept_state(
                error, f"going back to step {target}, whose checkpoint "
                       f"holds it, failed"
                       + (f": {failed}" if failed else " on local rank 0"))
        try:
            self.engine.restore_device_state()
        except depot.DepotError as e:
            self._refuse_recovery_with_kept_state(
                error, f"reading the state back at step {target}, whose "
                       f"checkpoint holds it, failed: {e}")
        self.kept_state_missing = False
        return target

    def _refuse_recovery_with_kept_state(self, error, why=""):
        """Raises `error` naming the remedy for a step that failed with
        parameters kept on the device and cannot recover by itself: a
        load_state_dict()."""
        if not self.offloads_all:
            raise type(error)(
                f"{error.message} (an engine with an offload fraction below "
                f"1 recovers by itself only to a checkpoint at or before "
                f"the servers' step that holds the optimizer state kept on "
                f"the device: a periodic one the engine filled, or one a "
                f"reference or checkpoint() of this optimizer made; "
                f"{why or 'there is none on every server'}, and that state "
                f"cannot go back to the servers' step otherwise; load a "
                f"state_dict() "
                f"saved by value, or a reference (state_dict(reference="
                f"True)), with load_state_dict())") from error

    def _recover_node(self, error):
        """A node of several local ranks after a failed step (`error`):
        on this rank (FinishStep's error), or on another, which this rank
        learned from the node's verdict (check_node). Every rank comes here
        once, in its own time: each drains its steps in flight (their
        collectives run on every rank whatever their outcome, so none
        waits for another), has the servers agree (Job.reconcile, which
        any number of ranks may call), waits until every rank's reconcile
        is over (Engine.synchronize_node: one rank's next step opened on
        the servers while another's reconcile still rolled them back was
        rolled back too, a second RolledBackError), takes the servers'
        weights and raises RolledBackError with the step they agree on.
        Always a rollback, also where every server is at the step before: the
        step's gradient left each rank reduce-scattered and cannot be sent
        again (the next step from that point is bitwise the same).
        With parameters kept on the device the node goes back further, to
        the newest checkpoint that holds their state
        (_back_to_whole_checkpoint).
        An error no server restart explains (the node's collectives
        aborted: a rank died or hung past the collective timeout) is
        raised as it is: no step can run on this engine again."""
        if not _restart_may_explain(error):
            raise error
        self._drain_in_flight()
        # The verdicts of the steps just drained no longer count.
        self._node_failure()
        at = self._reconcile(error)
        # No rank's next step may reach the servers before every rank's
        # reconcile is over: a later one would find that step half applied,
        # the servers at different steps, and roll it back.
        self.engine.synchronize_node()
        if not self.offloads_all:
            target = self._back_to_whole_checkpoint(at, error)
            self._roll_back(
                target, f"{error.message}; the optimizer state kept on the "
                        f"device went back with the servers to their "
                        f"checkpoint of step {target}, which holds it",
                ", on every local rank of the node")
        self._roll_back(at, error.message, ", on every local rank of the node")

    def _node_failure(self):
        """A node of several local ranks: the error naming an earlier step
        that failed on another rank (Engine.check_node: the verdicts of the
        steps finished here, each read once), or None. No step begins on
        the weights such a step left."""
        if self.local_ranks == 1:
            return None
        try:
            self.engine.check_node()
        except depot.DepotError as error:
            return error
        return None

    def _drain_in_flight(self):
        """Finishes every step in flight, whatever its outcome."""
        while self.in_flight:
            self.in_flight.pop(0)
            try:
                self.engine.finish_step()
            except depot.DepotError:
                pass

    def _reconcile(self, error):
        """Job.reconcile's step, or `error` saying it failed too."""
        try:
            at, _ = self.job.reconcile()
        except depot.DepotError as failed:
            raise type(error)(
                f"{error.message} (and the job could not be made "
                f"consistent again: {failed})") from error
        return at

    def _roll_back(self, at, why, where=""):
        """The parameters take the servers' weights of step `at`; raises
        RolledBackError saying why."""
        self.opt._restore_scaler(at)
        self.opt._depot_step = at
        self.opt._forget_whole_steps_after(at)
        self.pending_waits = set()  # the weights are loaded here
        self.load_weights()
        raise depot.RolledBackError(
            f"the job was rolled back to step {at} ({why}): reload the "
            f"trainer's data position for step {at} and go on with step "
            f"{at + 1}{where}", at)

    def flush(self):
        """Finishes every step in flight (the delayed update's last one) and
        makes its weights the parameters'."""
        self.wait_pending()
        finished = bool(self.in_flight)
        while self.in_flight:
            self._finish_one()
        # The last steps' verdicts: weights are read after this.
        failure = self._node_failure()
        if failure is not None:
            self._recover_node(failure)
        # The last capture's send: state_dict and load_state_dict come next,
        # whose checkpoint or load would drop a capture it still fills.
        self.opt._note_capture(self.engine.wait_captures())
        if self.delayed and finished:
            # The last step's weights have arrived but would be applied only
            # before the forward after next: take the servers' instead.
            self.load_weights()
        else:
            self._wait_all()
            self._remember_weights()

    def _wait_all(self):
        self.pending_waits = set()
        stream = self._stream()
        for b in range(len(self.engine.bucket_ranges)):
            self.engine.wait_weights(b, stream)

    def wait_pending(self):
        """Waits for every bucket forward has not waited for (attach())."""
        if self.pending_waits:
            stream = self._stream()
            for b in sorted(self.pending_waits):
                self.engine.wait_weights(b, stream)
            self.pending_waits = set()

    def attach(self, model):
        """Forward waits per bucket: each module of `model` waits, before
        its forward, for the buckets of its own parameters."""
        index = {id(p): i for i, p in enumerate(self.params)}
        covered = set()
        hooks = []
        for module in model.modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False)
                    if id(p) in index]
            if not mine:
                continue
            buckets = sorted({b for i in mine for b in self.buckets_of[i]})
            # Every forward of every micro-batch runs it; only the first of
            # a step has waits left (None: the module's inputs unchanged).
            hooks.append(module.register_forward_pre_hook(
                lambda module, inputs, buckets=buckets:
                    self._wait_buckets(buckets) if self.pending_waits
                    else None))
            covered.update(mine)
        if len(covered) < len(self.params):
            missing = len(self.params) - len(covered)
            for hook in hooks:
                hook.remove()
            raise ValueError(
                f"DepotOptimizer.attach: {missing} of the optimizer's "
                f"parameters are not parameters of the model's modules")
        # model.state_dict() hands out the parameters themselves: the
        # weights still arriving are waited for first (a checkpoint written
        # between step() and the next forward would hold them half copied).
        if hasattr(model, "register_state_dict_pre_hook"):  # torch >= 2.0
            hooks.append(model.register_state_dict_pre_hook(
                lambda *unused: self.wait_pending()))
        else:  # a hook after it, before anyone reads the tensors
            hooks.append(model._register_state_dict_hook(
                lambda *unused: self.wait_pending()))
        self.module_hooks.extend(hooks)
        self.attached = True

    def _wait_buckets(self, buckets):
        stream = self._stream()
        for b in buckets:
            if b in self.pending_waits:
                self.engine.wait_weights(b, stream)
                self.pending_waits.discard(b)

    def _after_step(self):
        if self.attached:
            self.pending_waits = set(range(len(self.engine.bucket_ranges)))
        else:
            self._wait_all()
        self.step += 1
        self._reset_step_state()
        if self.delayed:
            self._point_grads(self.step, copy_current=True)
        self._remember_weights()

    def _plain_step(self, no_grad):
        """This step as depot.Job.step, with the edited parameters' values as
        their master weights (only one step in flight: none here)."""
        opt = self.opt
        edited = set(self._edited_indices())
        if opt._sync_all:
            edited = set(range(len(self.params)))
        opt._sync_all = False
        overrides = [(i, self.params[i].detach().reshape(-1)
                      .to(torch.float32).cpu().contiguous())
                     for i in sorted(edited)]
        if edited:
            opt._warn_edit(sorted(edited))
        n = self.job.total_elems
        grads = self._grad_buffer(self.step)[:n].cpu()
        for index in no_grad:
            p, offset, numel = self.slots[index]
            grads[offset:offset + numel].zero_()
        weights = torch.empty(n, dtype=grads.dtype)
        # The parameters whose storage was replaced get it back.
        with torch.no_grad():
            for index in edited:
                p, offset, numel = self.slots[index]
                view = self.weights[offset:offset + numel].view_as(p)
                if p.data_ptr() != view.data_ptr():
                    view.copy_(p.detach())
                    p.data = view
        scale = opt._grad_scaler().scale
        result = self.job.step(
            self.step, grads, weights, group_hparams=opt._group_hparams(),
            loss_scale=scale, no_grad_tensors=no_grad,
            weight_overrides=overrides)
        with torch.no_grad():
            self.weights[:n].copy_(weights.to(self.device))
        opt._record_result(self.step, result, scale)
        return result

    def load_weights(self):
        """After the servers' state changed (load_state_dict): their weights
        become the parameters'."""
        n = self.job.total_elems
        weights = torch.empty(n, dtype=self.weights.dtype)
        self.job.pull(dtype=self.opt._weight_dtype, out=weights)
        with torch.no_grad():
            self.weights[:n].copy_(weights.to(self.device))
        # The servers' step may have changed (a loaded checkpoint).
        self.step = self.opt._depot_step + 1
        self._reset_step_state()
        if self.delayed:
            self._point_grads(self.step, copy_current=True)
        self._remember_weights()

    def close(self):
        self.wait_pending()
        for hook in self.module_hooks:
            hook.remove()
        self.remove_hooks()
        self.engine.close()


# Recoveries in a row before a step gives up (as the C++ client's): another
# worker's rollback may abort the resend of one that had just recovered.
_RECOVERY_ROUNDS = 3


def _restart_may_explain(error):
    """Whether a failed step may come from a server that restarted under it
    (the C++ client's rule, client/src/job_recovery.cc): the job id is gone
    (NOT_FOUND) or names another job (a fingerprint mismatch), the restored
    job is behind (ABORTED), or the server was down (UNAVAILABLE)."""
    if isinstance(error, depot.RolledBackError):
        return False
    if isinstance(error, (depot.NotFoundError, depot.AbortedError,
                          depot.UnavailableError)):
        return True
    return isinstance(error, depot.FailedPreconditionError) and \
        "fingerprint mismatch" in str(error)


def check_engine_params(params, device):
    """ValueError/TypeError unless every parameter is on `device` with one
    dtype (the gradient and weight buffers hold a single dtype)."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise TypeError(
            f"DepotOptimizer with an engine needs parameters of one dtype "
            f"(the engine's flat buffers hold one), not "
            f"{sorted(str(d) for d in dtypes)}")
    for p in params:
        if p.device != device:
            raise ValueError(f"a parameter is on {p.device}, another on "
                             f"{device}: an engine serves one device")


def engine_device(params, engine):
    """The torch.device an engine of kind `engine` ("cuda", "host" or None:
    automatic) serves for `params`, or None for no engine."""
    devices = {p.device for p in params}
    if engine is None:
        if all(d.type == "cpu" for d in devices):
            return None
        engine = "cuda"
    if engine == "host":
        if any(d.type != "cpu" for d in devices):
            raise ValueError("engine=\"host\" needs CPU parameters")
        return torch.device("cpu")
    if engine == "cuda":
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(
                f"engine=\"cuda\" needs every parameter on one CUDA device, "
                f"not {sorted(str(d) for d in devices)}")
        return next(iter(devices))
    raise ValueError(f"engine must be None, \"cuda\" or \"host\", not "
                     f"{engine!r}")
