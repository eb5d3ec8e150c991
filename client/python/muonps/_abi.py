"""muonps's C ABI (client/muonps_c.h) as ctypes declares it: the ABI
version, the enum and muonps_code values, the structs passed by pointer,
and every function's signature. `_native` loads the library against these
declarations and re-exports the public names.
"""

import ctypes

ABI_VERSION = 13
# Parameter groups are numbered [0, MAX_GROUPS) (MUONPS_MAX_GROUPS).
MAX_GROUPS = 1024

LAYOUT_REPLICATED = 1
LAYOUT_UNREDUCED = 2
LAYOUT_ROW_SHARDED = 3
# row_sharded, the stack's experts split whole over the ranks.
LAYOUT_ROW_SHARDED_EXPERTS = 4
ADJUST_LR_ORIGINAL = 1
ADJUST_LR_MATCH_RMS_ADAMW = 2
NS_AUTO = 0
NS_NS5 = 1
NS_GRAM = 2

CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
NOT_FOUND = 5
UNAVAILABLE = 14
DEADLINE_EXCEEDED = 4
FAILED_PRECONDITION = 9
# Not in muonps_code, but passed through from gRPC (a missing or wrong
# bearer token).
UNAUTHENTICATED = 16


class MuonpsError(RuntimeError):
    """A failed C ABI call: `code` is the muonps_code (gRPC/absl numbering)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.code_name = CODE_NAMES.get(code, str(code))



class _MuonHyper(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("momentum", ctypes.c_double), ("nesterov", ctypes.c_int),
                ("ns_steps", ctypes.c_int), ("adjust_lr_fn", ctypes.c_int),
                ("ns_algorithm", ctypes.c_int), ("polar_express", ctypes.c_int),
                ("ns_eps", ctypes.c_double),
                ("ns_coefficients", ctypes.c_double * 3)]


class _AdamWHyper(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double)]


class _StepResult(ctypes.Structure):
    _fields_ = [("pending", ctypes.c_int),
                ("already_applied", ctypes.c_int), ("seconds", ctypes.c_double),
                ("bytes_moved", ctypes.c_int64),
                ("momentum_reset", ctypes.c_int64),
                ("plan_version", ctypes.c_int64),
                ("adamw_applied", ctypes.c_int),
                ("repaired", ctypes.c_int)]


class _StepOptions(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("adamw_lr", ctypes.c_double), ("group_count", ctypes.c_int),
                ("group_lr", ctypes.POINTER(ctypes.c_double)),
                ("group_weight_decay", ctypes.POINTER(ctypes.c_double)),
                ("stream", ctypes.c_uint64), ("async_", ctypes.c_int),
                ("group_adamw_lr", ctypes.POINTER(ctypes.c_double)),
                ("group_adamw_weight_decay", ctypes.POINTER(ctypes.c_double))]


_c_int, _c_i64, _c_dbl, _c_str = (ctypes.c_int, ctypes.c_int64, ctypes.c_double,
                                  ctypes.c_char_p)
_f32p = ctypes.POINTER(ctypes.c_float)
_i64p = ctypes.POINTER(ctypes.c_int64)
_handle = ctypes.c_void_p
_SIGNATURES = {
    "muonps_version": (_c_str, []),
    "muonps_abi_version": (_c_int, []),
    "muonps_client_create": (_c_int, [_c_str, _c_str, _c_str, _c_int, _c_int,
                                      _c_dbl, ctypes.POINTER(_handle)]),
    "muonps_last_create_error": (_c_str, []),
    "muonps_client_destroy": (None, [_handle]),
    "muonps_client_last_error": (_c_str, [_handle]),
    "muonps_client_add_matrix": (_c_int, [_handle, _c_str, _c_i64, _c_i64,
                                          _c_i64, _c_int, _c_int]),
    "muonps_client_add_tensor": (_c_int, [_handle, _c_str, _c_i64, _c_int]),
    "muonps_client_start": (_c_int, [_handle, ctypes.POINTER(_MuonHyper),
                                     ctypes.POINTER(_AdamWHyper)]),
    "muonps_client_buffers": (_c_int, [_handle, _c_str, ctypes.POINTER(_f32p),
                                       ctypes.POINTER(_f32p), _i64p, _i64p,
                                       _i64p]),
    "muonps_client_get_momentum": (_c_int, [_handle, _c_str, _c_i64, _f32p,
                                            _c_i64]),
    "muonps_client_set_momentum": (_c_int, [_handle, _c_str, _c_i64, _f32p,
                                            _c_i64]),
    "muonps_client_get_adamw": (_c_int, [_handle, _c_str, _f32p, _f32p,
                                         _c_i64, _i64p]),
    "muonps_client_set_adamw": (_c_int, [_handle, _c_str, _f32p, _f32p,
                                         _c_i64, _c_i64]),
    "muonps_client_set_last_adamw_step": (_c_int, [_handle, _c_i64]),
    "muonps_client_resume_after": (_c_int, [_handle, _c_i64]),
    "muonps_client_create_on": (_c_int, [_c_str, _c_str, _c_str, _c_int,
                                         _c_int, _c_dbl, _c_str,
                                         ctypes.POINTER(_handle)]),
    "muonps_client_lend_cuda": (_c_int, [_handle, _c_str, ctypes.c_uint64,
                                         ctypes.c_uint64, _c_str]),
    "muonps_client_expect_dedicated_workers": (_c_int, [_handle, _c_int]),
    "muonps_client_set_replicas": (_c_int, [_handle, _c_int]),
    "muonps_client_allow_momentum_reset": (_c_int, [_handle, _c_int]),
    "muonps_client_set_checkpointing": (_c_int, [_handle, _c_str, _c_i64]),
    "muonps_client_checkpoint": (_c_int, [_handle,
                                          ctypes.POINTER(_c_i64)]),
    "muonps_client_last_checkpoint_step": (_c_int, [
        _handle, ctypes.POINTER(_c_i64)]),
    "muonps_client_restore_checkpoint": (_c_int, [
        _handle, _c_str, _c_i64, ctypes.POINTER(_c_i64)]),
    "muonps_client_set_group": (_c_int, [_handle, _c_int,
                                         ctypes.POINTER(_c_str), _c_int]),
    "muonps_client_step_with": (_c_int, [_handle, _c_i64,
                                         ctypes.POINTER(_StepOptions),
                                         ctypes.POINTER(_StepResult)]),
    "muonps_client_wait": (_c_int, [_handle, ctypes.POINTER(_StepResult)]),
    "muonps_client_gradient_ready": (_c_int, [_handle, _c_str,
                                              ctypes.c_void_p]),
    "muonps_client_wait_for_parameters": (_c_int, [_handle, ctypes.c_void_p,
                                                   _c_i64]),
    "muonps_client_place_gradient": (_c_int, [_handle, _c_str,
                                              ctypes.c_uint64]),
    "muonps_client_allocate_gradient": (
        _c_int, [_handle, _c_str, ctypes.POINTER(ctypes.c_uint64)]),
    "muonps_free_cuda_memory": (_c_int, [ctypes.c_uint64]),
}
