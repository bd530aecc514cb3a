"""The C API's contract (client/include/depot/depot.h), called directly
through ctypes: status codes, depot_last_error, defaults."""

import ctypes
import threading

import numpy as np

from depot import _capi

INVALID_ARGUMENT = 3
NOT_FOUND = 5


def lib():
    return _capi.lib()


def last_error():
    return lib().depot_last_error().decode()


def create_client(servers):
    addresses = (ctypes.c_char_p * len(servers))(*[s.encode()
                                                   for s in servers])
    handle = ctypes.c_void_p()
    code = lib().depot_client_create(addresses, len(servers), None,
                                     ctypes.byref(handle))
    return code, handle


def test_api_version_matches_the_package():
    assert lib().depot_api_version() == _capi.API_VERSION


def test_failure_returns_the_code_and_sets_last_error():
    code, handle = create_client([])
    assert code == INVALID_ARGUMENT
    assert not handle.value
    assert "servers is empty" in last_error()


def test_null_out_argument_is_invalid_argument_naming_it():
    addresses = (ctypes.c_char_p * 1)(b"127.0.0.1:1")
    assert lib().depot_client_create(addresses, 1, None,
                                     None) == INVALID_ARGUMENT
    assert last_error() == "depot_client_create: out is NULL"


def test_success_clears_last_error():
    create_client([])
    assert last_error()
    code, handle = create_client(["127.0.0.1:1"])
    assert code == 0
    assert last_error() == ""
    lib().depot_client_destroy(handle)


def test_last_error_is_per_thread():
    create_client([])
    seen = []
    thread = threading.Thread(target=lambda: seen.append(last_error()))
    thread.start()
    thread.join()
    assert seen == [""]
    assert "servers is empty" in last_error()


def test_malformed_address_is_invalid_argument():
    code, _ = create_client(["no-port-here"])
    assert code == INVALID_ARGUMENT
    assert "no-port-here" in last_error()


def test_status_names_are_the_canonical_ones():
    names = {code: lib().depot_status_name(code).decode()
             for code in (0, 3, 5, 9, 10, 14, 99)}
    assert names == {0: "OK", 3: "INVALID_ARGUMENT", 5: "NOT_FOUND",
                     9: "FAILED_PRECONDITION", 10: "ABORTED",
                     14: "UNAVAILABLE", 99: "UNKNOWN_CODE"}


def test_job_config_init_gives_the_documented_defaults():
    # Also checks that the ctypes mirror of the struct matches the header:
    # a shifted field would read as garbage here.
    config = _capi.JobConfig()
    lib().depot_job_config_init(ctypes.byref(config))
    optimizer = config.optimizer
    assert (config.num_workers, config.grad_dtype, config.weight_dtype,
            config.chunk_elems, config.alignment_elems) == (1, 1, 1, 1 << 20,
                                                           64)
    assert (optimizer.kind, optimizer.lr, optimizer.weight_decay) == (1, 1e-3,
                                                                      0.01)
    assert (optimizer.adam_beta1, optimizer.adam_beta2,
            optimizer.adam_eps) == (0.9, 0.999, 1e-8)
    assert (optimizer.initial_loss_scale, optimizer.loss_scale_window,
            optimizer.hysteresis) == (2.0 ** 32, 1000, 2)


def test_step_options_init_gives_no_overrides_and_loss_scale_one():
    options = _capi.StepOptions()
    lib().depot_step_options_init(ctypes.byref(options))
    assert (options.num_group_hparams, options.loss_scale,
            options.has_known_commit, options.known_clip_coef) == (0, 1.0, 0,
                                                                   1.0)


def test_unknown_dtype_is_invalid_argument_naming_the_field(servers):
    _, client = create_client(servers)
    tensors = (_capi.TensorSpec * 1)(_capi.TensorSpec(b"w", 10, 0))
    config = _capi.JobConfig()
    lib().depot_job_config_init(ctypes.byref(config))
    config.name, config.tensors, config.num_tensors = b"bad-dtype", tensors, 1
    config.grad_dtype = 7
    job = ctypes.c_void_p()
    code = lib().depot_job_open(client, ctypes.byref(config), 0,
                                ctypes.byref(job))
    assert code == INVALID_ARGUMENT
    assert "grad_dtype is 7" in last_error()
    lib().depot_client_destroy(client)


def test_server_error_code_and_message_come_through(servers, job_name):
    _, client = create_client(servers)
    tensors = (_capi.TensorSpec * 1)(_capi.TensorSpec(b"w", 10, 0))
    config = _capi.JobConfig()
    lib().depot_job_config_init(ctypes.byref(config))
    config.name, config.tensors, config.num_tensors = (job_name.encode(),
                                                       tensors, 1)
    job = ctypes.c_void_p()
    assert lib().depot_job_open(client, ctypes.byref(config), 0,
                                ctypes.byref(job)) == 0
    assert lib().depot_job_delete(job) == 0
    buffer = np.zeros(lib().depot_job_total_elems(job), dtype=np.float32)
    code = lib().depot_job_step(job, 1, buffer.ctypes.data,
                                buffer.ctypes.data, None, None)
    assert code == NOT_FOUND
    assert "not found" in last_error()
    lib().depot_job_destroy(job)
    lib().depot_client_destroy(client)
