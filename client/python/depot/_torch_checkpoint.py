"""DepotOptimizer's state and checkpoints (depot.torch's module docstring,
"Checkpoints"): torch's per-parameter state read from the servers, the
state dicts by value, by reference and in torch's own format, and loading
them. A mixin of DepotOptimizer, which provides the job (_open_job), the
slots (_slots), the parameters' groups and the loss scaler.
"""

import torch

import depot
from depot import _state_reference as state_reference
from depot import _torch_args as args
from depot import _torch_state as torch_state

# DepotOptimizer.state_dict's keys for the servers' state and its step.
_STATE_KEY = "depot_state"
_STEP_KEY = "depot_step"
_SCALER_KEY = "depot_grad_scaler"
# ... or, instead of the state, a reference to a server-side checkpoint.
_REFERENCE_KEY = "depot_reference"
_DEPOT_KEYS = (_STATE_KEY, _REFERENCE_KEY, _STEP_KEY, _SCALER_KEY)


class CheckpointMixin:
    """state_dict, load_state_dict, torch_state_dict and what they read.

    With an offload fraction below 1 the optimizer state of the parameters
    kept on the device lives in the engine, not on the servers: the state
    read here is the servers' with the engine's overlaid
    (Engine.read_device_state), and a loaded state goes to both."""

    def _device_engine(self):
        """The engine holding some parameters' optimizer state, or None."""
        driver = getattr(self, "_driver", None)
        if driver is None or driver.offloads_all:
            return None
        return driver.engine

    def gather_state(self):
        """Reads the whole optimizer state now, for state_dict(),
        torch_state_dict() and state until the next step. Needed only with
        offload_fraction < 1 on a node of several local ranks: each rank
        holds the state of its own chunks of the parameters kept on the
        device, so reading it is a collective of the node (as a step is).
        Call it on every local rank, then state_dict() on any of them, e.g.

            opt.gather_state()            # every local rank
            if rank == 0:
                torch.save(opt.state_dict(), path)

        Each call is a collective there, also at a step already gathered.
        There it also writes each rank's part into the servers' own arrays
        (Engine.store_device_state, which returns once every rank has), so
        that state_dict(reference=True) or checkpoint() on any rank, until
        the next step, has the servers checkpoint the whole state. Elsewhere
        it only reads the state early."""
        self._flat_state("gather_state", gather=True)
        engine = self._device_engine()
        if engine is not None and self._driver.local_ranks > 1:
            engine.store_device_state()  # a collective of the node here
            self._kept_stored_step = self._depot_step

    def _write_device_state(self, engine, flat):
        """Loads the kept parameters' part of `flat` onto the device: their
        state is known from here on (also after resume=True)."""
        engine.write_device_state(flat)
        self._driver.kept_state_missing = False

    def _store_kept_state(self, what):
        """Before the servers checkpoint for `what`: the kept parameters'
        optimizer state written into the servers' own arrays
        (Engine.store_device_state), so that the checkpoint holds the whole
        state. On a node of several local ranks every rank has stored its
        part in gather_state() at this step; ValueError naming it when not
        (a rank alone cannot: the others' parts are on their devices)."""
        engine = self._device_engine()
        if engine is None:
            return
        if self._driver.local_ranks == 1:
            engine.store_device_state()
        elif self._kept_stored_step != self._depot_step:
            raise ValueError(
                f"{what}: with offload_fraction < 1 on a node of "
                f"{self._driver.local_ranks} local ranks, each rank holds "
                f"the optimizer state of its own chunks of the parameters "
                f"kept on the device, which the servers' checkpoint must "
                f"hold: call gather_state() on every local rank first (a "
                f"collective of the node, which writes each rank's part to "
                f"the servers), then {what} on any of them")

    def _note_whole_step(self, step):
        """The servers' checkpoint of `step` holds the kept parameters'
        state too (stored just before it was written)."""
        if self._device_engine() is not None:
            self._whole_steps.add(step)

    def _forget_whole_steps_after(self, step):
        """The job went back to `step`: its later checkpoints are gone."""
        self._whole_steps = {s for s in self._whole_steps if s <= step}

    def _flat_state(self, what, gather=False):
        """The whole state (depot.FlatState): the servers', with the engine's
        kept parameters' state over it; read once per step, and at every
        gather (a collective: every rank reads, whatever its cache holds).
        ValueError for `what` where the read is a collective and `gather`
        is False."""
        job = self._open_job()
        self.synchronize()
        if not self._initialized:
            return None
        if gather or self._state_cache is None or \
                self._state_cache[0] != self._depot_step:
            engine = self._device_engine()
            if engine is not None and self._driver.local_ranks > 1 and \
                    not gather:
                raise ValueError(
                    f"{what}: with offload_fraction < 1 on a node of "
                    f"{self._driver.local_ranks} local ranks, each rank "
                    f"holds the optimizer state of its own chunks of the "
                    f"parameters kept on the device: call gather_state() "
                    f"on every local rank first (a collective of the "
                    f"node)")
            flat = job.decode_state(job.save_state_array())
            if engine is not None:
                engine.read_device_state(flat)
            self._state_cache = (self._depot_step, flat)
        return self._state_cache[1]

    def _param_state(self, index):
        """torch's state dict of parameter `index` (all-groups order)."""
        flat = self._flat_state("the optimizer's state")
        p, offset, numel = self._slots[index]
        group = self._group_of(index)
        if flat is None:
            count, slot_views = 0, [torch.zeros_like(p, dtype=torch.float32)
                                    for _ in range(3)]
            if self._kind == "adagrad":
                slot_views[0].fill_(self._initial_accumulator)
        else:
            count = int(flat.tensor_steps[index])
            slot_views = [torch.from_numpy(s[offset:offset + numel].copy())
                          .view_as(p) for s in flat.slots]
        return torch_state.torch_param_state(self._kind, group, count,
                                             slot_views)

    def _group_of(self, index):
        for group in self.param_groups:
            if index < len(group["params"]):
                return group
            index -= len(group["params"])
        raise IndexError(index)

    def torch_state_dict(self):
        """A state dict in torch.optim's own format (the state read from the
        servers), which the torch.optim optimizer of the same kind loads."""
        self._open_job()
        packed = {}
        for index in range(len(self._slots)):
            state = self._param_state(index)
            if state:
                packed[index] = state
        return {"state": packed, "param_groups": self._packed_groups()}

    def _packed_groups(self):
        """param_groups as torch's state_dict packs them: each parameter by
        its index over all groups."""
        groups, start = [], 0
        for group in self.param_groups:
            packed_group = {k: v for k, v in group.items() if k != "params"}
            packed_group["params"] = list(
                range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed_group)
        return groups

    def state_dict(self, torch_format=False, reference=None):
        """Depot's checkpoint (module docstring): torch's "param_groups",
        the step under "depot_step", the loss scaler under
        "depot_grad_scaler", and the servers' state, one of:

        - by value (reference=False): the state's bytes under "depot_state",
          a uint8 tensor over the library's buffer (torch.save writes it
          without another copy; None before the first step);
        - by reference (reference=True): the servers write a checkpoint now
          (checkpoint()) and "depot_reference" holds {"job", "fingerprint",
          "step", "servers", "location"} instead: a few hundred bytes
          whatever the model's size. It needs servers with --checkpoint_dir
          (FailedPreconditionError otherwise), and the checkpoint must
          still be there when the dict is loaded (--checkpoint_keep). With
          offload_fraction < 1 the kept parameters' state is first written
          into the servers' arrays, so that the checkpoint holds it; on a
          node of several local ranks gather_state() on every rank does
          that, before this on any (ValueError otherwise).

        reference=None: the constructor's state_dict_reference (False by
        default), so that a trainer that calls state_dict() itself saves by
        reference. torch_format=True: torch_state_dict() instead."""
        if torch_format:
            return self.torch_state_dict()
        self.synchronize()
        # Not torch's state_dict(): it would read the servers' state into
        # "state", which depot_state carries already.
        state = {"state": {}, "param_groups": self._packed_groups()}
        job = self._open_job()
        if reference is None:
            reference = self._state_dict_reference
        if not self._initialized:
            state[_STATE_KEY] = None  # nothing on the servers yet
        elif reference:
            self._store_kept_state("state_dict(reference=True)")
            state[_REFERENCE_KEY] = state_reference.take(
                job, self._client.servers)
            self._note_whole_step(state[_REFERENCE_KEY]["step"])
        elif self._device_engine() is not None:
            state[_STATE_KEY] = torch.frombuffer(
                bytearray(job.encode_state(self._flat_state("state_dict"))),
                dtype=torch.uint8)
        else:
            state[_STATE_KEY] = torch.from_numpy(job.save_state_array())
        state[_STEP_KEY] = self._depot_step
        state[_SCALER_KEY] = self._grad_scaler().state_dict()
        return state

    def load_state_dict(self, state_dict):
        """Loads a state dict of DepotOptimizer.state_dict (the servers'
        state, or a reference to their checkpoint), or of the torch.optim
        optimizer of the same kind (its per-parameter state, with the
        parameters' current values as master weights). The next step()
        continues from it. ValueError when the dict's fixed hyperparameters
        (betas, eps, ...) differ from this optimizer's;
        depot.FailedPreconditionError for a Depot state of another job
        config; depot.DataLossError if it is corrupt.

        A reference (state_dict(reference=True)) takes every server of the
        job back to the referenced step (Job.roll_back: steps in flight are
        dropped, the servers' checkpoint of the step restored) and the
        parameters take its weights; this works in a new process that opens
        the job by the same job_name (with an engine, pass resume=True).
        ValueError: a reference to another job;
        depot.FailedPreconditionError: another config (fingerprint), or a
        server behind the step; depot.NotFoundError: a server no longer
        holds the checkpoint (pruned by --checkpoint_keep)."""
        self.synchronize()
        if not any(k in state_dict for k in _DEPOT_KEYS):
            self._open_job()
            self._load_torch_state_dict(state_dict)
            return
        by_reference = _REFERENCE_KEY in state_dict
        source = _REFERENCE_KEY if by_reference else _STATE_KEY
        missing = [k for k in (source, _STEP_KEY, _SCALER_KEY)
                   if k not in state_dict]
        if missing:
            raise KeyError(f"DepotOptimizer.load_state_dict: the state dict "
                           f"has no {', '.join(missing)}: it was not made by "
                           f"DepotOptimizer.state_dict")
        torch_state = {k: v for k, v in state_dict.items()
                       if k not in _DEPOT_KEYS}
        # Checked before anything changes: the reference's job, then (torch's
        # load_state_dict checks the groups) the fixed hyperparameters; the
        # servers check the state or the reference's step.
        if by_reference:
            reference = state_dict[_REFERENCE_KEY]
            state_reference.check_job_name(reference,
                                           self._job_args["job_name"])
        job = self._open_job()
        engine = self._device_engine()
        args.check_fixed(self._kind, self._fixed, torch_state["param_groups"],
                         what="the state dict's param group")
        if by_reference:
            step = state_reference.restore(job, reference,
                                           self._client.servers)
            self._forget_whole_steps_after(step)
            if engine is not None:
                # The referenced checkpoint holds the kept parameters'
                # state (state_dict stored it before the servers took it).
                engine.restore_device_state()
                self._driver.kept_state_missing = False
            loaded = True
        else:
            blob = state_dict[_STATE_KEY]
            if blob is not None:
                job.load_state(blob)
                self._whole_steps = set()  # the import removed checkpoints
                if engine is not None:
                    self._write_device_state(engine, job.decode_state(blob))
            loaded = blob is not None
            step = int(state_dict[_STEP_KEY])
        # After the servers accepted the state; a scaler state made by
        # state_dict() always fits the same config.
        self._grad_scaler().load_state_dict(state_dict[_SCALER_KEY])
        # A new history from the loaded step on.
        self._scaler_history.clear()
        self._scaler_history[step] = self._grad_scaler().state_dict()
        torch_state["state"] = {}
        super().load_state_dict(torch_state)
        self.state = ServerState(self)
        self._depot_step = step
        self._initialized = loaded
        self._after_load()
        if by_reference and self._driver is None:
            # The engine's parameters are its buffers, which _after_load
            # filled; here the weights are copied in.
            with torch.no_grad():
                self._write_params()

    def _load_torch_state_dict(self, state_dict):
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"])
                for s, g in zip(saved_groups, self.param_groups)):
            raise ValueError("loaded state dict's param groups do not match "
                             "this optimizer's (number of groups or of "
                             "parameters in a group)")
        args.check_fixed(self._kind, self._fixed, saved_groups,
                         what="the state dict's param group")
        job = self._job
        n = job.total_elems
        slots = self._num_slots()
        flat_slots = [torch.zeros(n, dtype=torch.float32)
                      for _ in range(slots)]
        tensor_steps = []
        master = torch.zeros(n, dtype=torch.float32)
        saved_state = state_dict["state"]
        ids = [i for s in saved_groups for i in s["params"]]
        for index, (p, offset, numel) in enumerate(self._slots):
            master[offset:offset + numel].copy_(p.detach().reshape(-1))
            state = saved_state.get(ids[index], {})
            if self._kind == "adagrad" and not state:
                state = {"step": 0, "sum": torch.full(
                    (numel,), float(self._initial_accumulator))}
            count, values = torch_state.depot_param_state(
                self._kind, self._group_of(index), state, numel, slots)
            tensor_steps.append(count)
            for flat, value in zip(flat_slots, values):
                if value is not None:
                    flat[offset:offset + numel].copy_(value)
        applied = max([self._depot_step] + tensor_steps)
        engine = self._device_engine()
        flat = depot.FlatState(
            applied_step=applied, master=master.numpy(),
            slots=[s.numpy() for s in flat_slots], tensor_steps=tensor_steps)
        job.load_state(job.encode_state(flat))
        self._whole_steps = set()  # the import removed the checkpoints
        if engine is not None:
            self._write_device_state(engine, flat)
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._depot_step = applied
        self._initialized = True
        self._after_load()

    def _num_slots(self):
        return depot._capi.lib().depot_job_num_state_slots(
            self._job._live_handle())

    def _after_load(self):
        """After the servers' state changed: what Depot last wrote into the
        parameters is now the servers' weights."""
        self._state_cache = None
        self._kept_stored_step = None
        if self._initialized:
            if self._driver is not None:
                self._driver.load_weights()
            else:
                self._job.pull(dtype=self._weight_dtype, out=self._weights)


class ServerState:
    """DepotOptimizer.state: torch's per-parameter state, read from the
    servers (once per step) when accessed. state[p] is {} for a parameter
    that has none yet, as torch's defaultdict gives."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def __getitem__(self, param):
        self._optimizer._open_job()
        index = self._optimizer._index.get(id(param))
        if index is None:
            return {}
        return self._optimizer._param_state(index)

    def get(self, param, default=None):
        state = self[param]
        return state if state else default

    def __contains__(self, param):
        return bool(self[param])

    def keys(self):
        return [p for p in self._optimizer._all_params() if self[p]]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def items(self):
        return [(p, self[p]) for p in self.keys()]

    def values(self):
        return [self[p] for p in self.keys()]

    def __repr__(self):
        return f"<DepotOptimizer state of {len(self)} parameters>"
