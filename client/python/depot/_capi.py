"""ctypes mirror of client/include/depot/depot.h.

The structs and prototypes below must match the header field for field;
API_VERSION is the header's DEPOT_API_VERSION, checked when the library is
loaded so that a mismatched build fails loudly instead of misreading memory.
"""

import ctypes
import threading

from depot import _loader
from depot import errors

API_VERSION = 16

c_double = ctypes.c_double
c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p


class ClientOptions(ctypes.Structure):
    _fields_ = [
        ("rpc_timeout_seconds", c_double),
        ("step_timeout_seconds", c_double),
        ("max_inflight_chunks", c_int32),
        ("connections_per_server", c_int32),
        ("unavailable_retry_seconds", c_double),
        ("tls_ca_file", c_char_p),
        ("tls_cert_file", c_char_p),
        ("tls_key_file", c_char_p),
        ("auth_token", c_char_p),
        ("auth_token_file", c_char_p),
    ]


class TensorSpec(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("numel", c_uint64),
        ("param_group", c_uint32),
    ]


class OptimizerConfig(ctypes.Structure):
    _fields_ = [
        ("kind", c_int32),
        ("lr", c_double),
        ("min_lr", c_double),
        ("weight_decay", c_double),
        ("adam_beta1", c_double),
        ("adam_beta2", c_double),
        ("adam_eps", c_double),
        ("sgd_momentum", c_double),
        ("sgd_dampening", c_double),
        ("sgd_nesterov", c_int32),
        ("adagrad_lr_decay", c_double),
        ("adagrad_initial_accumulator_value", c_double),
        ("adagrad_eps", c_double),
        ("lion_beta1", c_double),
        ("lion_beta2", c_double),
        ("exp_avg_dtype", c_int32),
        ("exp_avg_sq_dtype", c_int32),
        ("clip_grad", c_double),
        ("clip_grad_norm_type", c_int32),
        ("grad_norm_skip_threshold", c_double),
        ("loss_scale", c_double),
        ("initial_loss_scale", c_double),
        ("min_loss_scale", c_double),
        ("loss_scale_window", c_double),
        ("hysteresis", c_int32),
        ("amsgrad", c_int32),
        ("maximize", c_int32),
    ]


class JobConfig(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("tensors", ctypes.POINTER(TensorSpec)),
        ("num_tensors", c_size_t),
        ("num_workers", c_uint32),
        ("optimizer", OptimizerConfig),
        ("grad_dtype", c_int32),
        ("weight_dtype", c_int32),
        ("chunk_elems", c_uint64),
        ("alignment_elems", c_uint64),
        ("group_optimizers", ctypes.POINTER(OptimizerConfig)),
        ("num_group_optimizers", c_size_t),
        ("checkpoint_every_steps", c_uint64),
    ]


class GroupHyperParams(ctypes.Structure):
    _fields_ = [
        ("param_group", c_uint32),
        ("lr", c_double),
        ("weight_decay", c_double),
    ]


class TensorWeights(ctypes.Structure):
    _fields_ = [
        ("tensor_index", c_uint32),
        ("values", ctypes.POINTER(ctypes.c_float)),
    ]


class StepOptions(ctypes.Structure):
    _fields_ = [
        ("group_hparams", ctypes.POINTER(GroupHyperParams)),
        ("num_group_hparams", c_size_t),
        ("loss_scale", c_double),
        ("has_known_commit", c_int32),
        ("known_clip_coef", c_double),
        ("known_skip", c_int32),
        ("no_grad_tensors", ctypes.POINTER(c_uint32)),
        ("num_no_grad_tensors", c_size_t),
        ("weight_overrides", ctypes.POINTER(TensorWeights)),
        ("num_weight_overrides", c_size_t),
    ]


class StepResult(ctypes.Structure):
    _fields_ = [
        ("step", c_uint64),
        ("chunks", c_uint64),
        ("chunks_replayed", c_uint64),
        ("bytes_sent", c_uint64),
        ("bytes_received", c_uint64),
        ("update_seconds", c_double),
        ("wall_seconds", c_double),
        ("two_phase", c_int32),
        ("grad_norm", c_double),
        ("zero_count", c_uint64),
        ("found_inf", c_int32),
        ("skipped", c_int32),
        ("clip_coef", c_double),
        ("capture_step", c_uint64),
        ("capture_chunks", c_uint64),
        ("capture_error", ctypes.c_char * 512),
    ]


class CaptureReport(ctypes.Structure):
    _fields_ = [
        ("step", c_uint64),
        ("chunks", c_uint64),
        ("error", ctypes.c_char * 512),
    ]


class FlatState(ctypes.Structure):
    _fields_ = [
        ("applied_step", c_uint64),
        ("master", ctypes.POINTER(ctypes.c_float)),
        ("slots", ctypes.POINTER(ctypes.c_float) * 3),
        ("tensor_steps", ctypes.POINTER(c_uint64)),
    ]


class ServerStatus(ctypes.Structure):
    _fields_ = [
        ("server", c_char_p),
        ("job_id", c_uint64),
        ("step", c_uint64),
        ("shard_begin", c_uint64),
        ("shard_end", c_uint64),
        ("state_bytes", c_uint64),
        ("state_checksum", c_uint64),
        ("pending_step", c_uint64),
        ("missing_workers", ctypes.POINTER(c_uint32)),
        ("num_missing_workers", c_size_t),
        ("waiting_seconds", c_double),
    ]


class GradScalerState(ctypes.Structure):
    _fields_ = [
        ("scale", c_double),
        ("growth_tracker", ctypes.c_int64),
        ("hysteresis_tracker", ctypes.c_int64),
    ]


class EngineOptions(ctypes.Structure):
    _fields_ = [
        ("device", c_int32),
        ("cuda_device", c_int32),
        ("local_rank", c_uint32),
        ("local_ranks", c_uint32),
        ("unique_id", ctypes.c_uint8 * 128),
        ("bucket_chunks", c_uint64),
        ("d2h_slots", c_int32),
        ("h2d_slots", c_int32),
        ("streams_per_server", c_int32),
        ("delayed_update", c_int32),
        ("offload_fraction", c_double),
        ("host_copy_bytes_per_second", c_double),
        ("collective_timeout_seconds", c_double),
    ]


def _p(struct):
    return ctypes.POINTER(struct)


# name: (restype, argtypes). Functions returning int return a status code.
_PROTOTYPES = {
    "depot_api_version": (c_uint32, []),
    "depot_last_error": (c_char_p, []),
    "depot_last_error_rolled_back": (ctypes.c_int, [ctypes.POINTER(c_uint64)]),
    "depot_status_name": (c_char_p, [ctypes.c_int]),
    "depot_client_options_init": (None, [_p(ClientOptions)]),
    "depot_client_create": (ctypes.c_int, [
        ctypes.POINTER(c_char_p), c_size_t, _p(ClientOptions),
        ctypes.POINTER(c_void_p)]),
    "depot_client_wait_for_servers": (ctypes.c_int, [c_void_p, c_double]),
    "depot_client_destroy": (None, [c_void_p]),
    "depot_retain_transport_buffers": (ctypes.c_int, []),
    "depot_job_config_init": (None, [_p(JobConfig)]),
    "depot_job_open": (ctypes.c_int, [
        c_void_p, _p(JobConfig), c_uint32, ctypes.POINTER(c_void_p)]),
    "depot_job_total_elems": (c_uint64, [c_void_p]),
    "depot_job_num_tensors": (c_size_t, [c_void_p]),
    "depot_job_tensor_offset": (c_uint64, [c_void_p, c_size_t]),
    "depot_job_fingerprint": (c_uint64, [c_void_p]),
    "depot_job_num_servers": (c_uint32, [c_void_p]),
    "depot_job_init_weights": (ctypes.c_int, [c_void_p, c_void_p, c_int32]),
    "depot_step_options_init": (None, [_p(StepOptions)]),
    "depot_job_step": (ctypes.c_int, [
        c_void_p, c_uint64, c_void_p, c_void_p, _p(StepOptions),
        _p(StepResult)]),
    "depot_job_pull": (ctypes.c_int, [
        c_void_p, c_uint64, c_uint64, c_int32, c_void_p]),
    "depot_job_pull_at": (ctypes.c_int, [
        c_void_p, c_uint64, c_uint64, c_int32, c_uint64, c_void_p]),
    "depot_job_status": (ctypes.c_int, [
        c_void_p, c_int32, _p(ServerStatus), c_size_t]),
    "depot_job_delete": (ctypes.c_int, [c_void_p]),
    "depot_job_destroy": (None, [c_void_p]),
    "depot_job_save_state": (ctypes.c_int, [
        c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)]),
    "depot_job_load_state": (ctypes.c_int, [c_void_p, c_void_p, c_size_t]),
    "depot_job_num_state_slots": (c_size_t, [c_void_p]),
    "depot_job_decode_state": (ctypes.c_int, [
        c_void_p, c_void_p, c_size_t, _p(FlatState)]),
    "depot_job_encode_state": (ctypes.c_int, [
        c_void_p, _p(FlatState), ctypes.POINTER(c_void_p),
        ctypes.POINTER(c_size_t)]),
    "depot_job_checkpoint": (ctypes.c_int, [
        c_void_p, ctypes.POINTER(c_uint64)]),
    "depot_job_reconcile": (ctypes.c_int, [
        c_void_p, ctypes.POINTER(c_uint64), ctypes.POINTER(ctypes.c_int)]),
    "depot_job_roll_back": (ctypes.c_int, [c_void_p, c_uint64]),
    "depot_job_newest_checkpoint_with_worker_state": (
        ctypes.c_int, [c_void_p, c_uint64, ctypes.POINTER(c_uint64)]),
    "depot_job_import_checkpoint": (ctypes.c_int, [
        c_void_p, c_uint64, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "depot_buffer_free": (None, [c_void_p]),
    "depot_engine_options_init": (None, [_p(EngineOptions)]),
    "depot_engine_unique_id": (ctypes.c_int, [
        c_int32, ctypes.POINTER(ctypes.c_uint8)]),
    "depot_engine_create": (ctypes.c_int, [
        c_void_p, _p(EngineOptions), ctypes.POINTER(c_void_p)]),
    "depot_engine_grads": (c_void_p, [c_void_p]),
    "depot_engine_grads_of_step": (c_void_p, [c_void_p, c_uint64]),
    "depot_engine_weights": (c_void_p, [c_void_p]),
    "depot_engine_padded_elems": (c_uint64, [c_void_p]),
    "depot_engine_num_buckets": (c_uint64, [c_void_p]),
    "depot_engine_bucket_range": (ctypes.c_int, [
        c_void_p, c_uint64, ctypes.POINTER(c_uint64),
        ctypes.POINTER(c_uint64)]),
    "depot_engine_pinned_bytes": (c_uint64, [c_void_p]),
    "depot_engine_device_tensors": (c_size_t, [
        c_void_p, ctypes.POINTER(c_uint32), c_size_t]),
    "depot_engine_read_device_state": (ctypes.c_int, [
        c_void_p, _p(FlatState)]),
    "depot_engine_write_device_state": (ctypes.c_int, [
        c_void_p, _p(FlatState)]),
    "depot_engine_begin_step": (ctypes.c_int, [
        c_void_p, c_uint64, _p(StepOptions)]),
    "depot_engine_gradients_ready": (ctypes.c_int, [
        c_void_p, c_uint64, c_void_p]),
    "depot_engine_wait_weights": (ctypes.c_int, [
        c_void_p, c_uint64, c_void_p]),
    "depot_engine_finish_step": (ctypes.c_int, [c_void_p, _p(StepResult)]),
    "depot_engine_wait_captures": (
        ctypes.c_int, [c_void_p, _p(CaptureReport)]),
    "depot_engine_check_node": (ctypes.c_int, [c_void_p]),
    "depot_engine_synchronize_node": (ctypes.c_int, [c_void_p]),
    "depot_engine_agree_on_step": (
        ctypes.c_int, [c_void_p, c_uint64, ctypes.POINTER(c_uint64)]),
    "depot_engine_store_device_state": (ctypes.c_int, [c_void_p]),
    "depot_engine_restore_device_state": (ctypes.c_int, [c_void_p]),
    "depot_engine_destroy": (None, [c_void_p]),
    "depot_grad_scaler_create": (ctypes.c_int, [
        c_void_p, ctypes.POINTER(c_void_p)]),
    "depot_grad_scaler_scale": (c_double, [c_void_p]),
    "depot_grad_scaler_update": (None, [c_void_p, c_int32]),
    "depot_grad_scaler_get_state": (ctypes.c_int, [
        c_void_p, _p(GradScalerState)]),
    "depot_grad_scaler_load_state": (ctypes.c_int, [
        c_void_p, _p(GradScalerState)]),
    "depot_grad_scaler_destroy": (None, [c_void_p]),
}

_lock = threading.Lock()
_library = None


def _declare(library):
    # The version first: a library of another version may lack a function.
    library.depot_api_version.restype = c_uint32
    library.depot_api_version.argtypes = []
    version = library.depot_api_version()
    if version != API_VERSION:
        raise _loader.LibraryNotFoundError(
            f"{library._name} implements depot.h API version {version}, this "
            f"package needs {API_VERSION}: use the library built from the "
            f"same source tree as the package")
    for name, (restype, argtypes) in _PROTOTYPES.items():
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes


def lib():
    """The loaded, declared library (loaded on first use)."""
    global _library
    with _lock:
        if _library is None:
            library = _loader.load_library()
            _declare(library)
            _library = library
        return _library


def check(code):
    """Raises the DepotError for `code` (with this thread's last error) unless
    it is DEPOT_OK. Call it right after the C call, on the same thread."""
    if code != 0:
        library = lib()
        message = library.depot_last_error().decode("utf-8", "replace")
        step = c_uint64()
        if library.depot_last_error_rolled_back(ctypes.byref(step)):
            raise errors.RolledBackError(message, step.value)
        raise errors.error_for_code(code, message)
