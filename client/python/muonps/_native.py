"""ctypes bindings of muonps's C ABI (client/muonps_c.h).

`load_library()` finds and loads libmuonps.so once per process; `NativeClient`
owns one `muonps_client` handle and turns every non-zero muonps_code into a
`MuonpsError` carrying the code and the library's message. A NativeClient is
used by one thread at a time, like the handle it wraps (`gradient_ready`
excepted: gradient hooks call it from autograd's thread). The ABI's
declarations (enums, codes, structs, signatures) live in `_abi`.
"""

import collections
import ctypes
import os
import pathlib
import threading

# The ABI's declarations; the public names are re-exported from here.
from ._abi import (  # noqa: F401 (re-exported)
    _SIGNATURES, ABI_VERSION, ADJUST_LR_MATCH_RMS_ADAMW, ADJUST_LR_ORIGINAL,
    CODE_NAMES, DEADLINE_EXCEEDED, FAILED_PRECONDITION, LAYOUT_REPLICATED,
    LAYOUT_ROW_SHARDED, LAYOUT_ROW_SHARDED_EXPERTS, LAYOUT_UNREDUCED,
    MAX_GROUPS, NOT_FOUND, NS_AUTO,
    NS_GRAM, NS_NS5, UNAUTHENTICATED,
    UNAVAILABLE, MuonpsError, _AdamWHyper, _c_i64, _c_str, _f32p, _handle,
    _MuonHyper, _StepOptions, _StepResult)

BUILD_COMMAND = "bazel build //client:libmuonps.so"

# What a step call answers (muonps_step_result): `pending` (an async step
# was enqueued; wait() ends it), `already_applied` (the workers had
# committed this step id before), `adamw_applied` (this call stepped the
# client's AdamW tensors: once per committed step id) and `momentum_reset`
# (matrices of the local worker that started from zero momentum).
StepOutcome = collections.namedtuple(
    "StepOutcome", "pending already_applied adamw_applied momentum_reset")


class LibraryNotFoundError(ImportError):
    """libmuonps.so could not be found or loaded; the message lists the paths."""


_lock = threading.Lock()
_library = None


def candidate_paths(environ=None):
    """Where libmuonps.so is looked for, in order (existing or not)."""
    environ = os.environ if environ is None else environ
    package = pathlib.Path(__file__).resolve().parent
    paths = []
    if environ.get("MUONPS_LIB"):
        paths.append(pathlib.Path(environ["MUONPS_LIB"]))
    paths.append(package / "lib" / "libmuonps.so")
    # In a checkout the package sits at <repo>/client/python/muonps.
    root = package.parents[2]
    if root / "client" / "python" / "muonps" == package:
        paths.append(root / "bazel-bin" / "client" / "libmuonps.so")
    paths.append(pathlib.Path.cwd() / "bazel-bin" / "client" / "libmuonps.so")
    unique = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique


def _open(path):
    """Loads one library and declares the C ABI's signatures on it."""
    lib = ctypes.CDLL(str(path))
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        # A shared library linked without the C ABI's objects (the cc_library
        # behind it needs alwayslink) loads fine but exports nothing.
        raise LibraryNotFoundError(
            f"{path} exports none of muonps's C ABI ({missing[0]} is missing): "
            "it was linked without client/muonps_c.cc's objects; the "
            "muonps_c cc_library in client/BUILD needs `alwayslink = True`, "
            f"then `{BUILD_COMMAND}`")
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    if lib.muonps_abi_version() != ABI_VERSION:
        raise LibraryNotFoundError(
            f"{path} has C ABI {lib.muonps_abi_version()}; this package needs "
            f"{ABI_VERSION}: rebuild it with `{BUILD_COMMAND}`")
    return lib


class CudaMemory:
    """Device memory the C ABI allocated (Client.allocate_gradient): its
    device pointer, freed when this object goes. Wrap it in a tensor that
    keeps it alive (muonps._cuda does, through __cuda_array_interface__)."""

    def __init__(self, lib, ptr):
        self._lib = lib
        self.ptr = ptr

    def __del__(self):
        if self.ptr and self._lib is not None:
            self._lib.muonps_free_cuda_memory(self.ptr)
            self.ptr = 0


def load_library(environ=None):
    """Loads libmuonps.so from the first candidate path that works.

    A $MUONPS_LIB that exists must work; other candidates that fail to load
    are skipped. Raises LibraryNotFoundError naming every path tried (and
    why it failed) and the bazel command that builds the library.
    `environ` (tests) replaces os.environ and bypasses the process's cache.
    """
    global _library
    with _lock:
        if _library is not None and environ is None:
            return _library
        env = os.environ if environ is None else environ
        explicit = env.get("MUONPS_LIB")
        tried = []
        for path in candidate_paths(environ):
            if not path.is_file():
                tried.append(f"{path} (absent)")
                continue
            try:
                lib = _open(path)
            except (OSError, LibraryNotFoundError) as e:
                if explicit and path == pathlib.Path(explicit):
                    raise LibraryNotFoundError(f"MUONPS_LIB: {e}") from e
                tried.append(f"{path} ({e})")
                continue
            if environ is None:
                _library = lib
            return lib
        raise LibraryNotFoundError(
            "cannot load libmuonps.so; tried:\n  " + "\n  ".join(tried) +
            f"\nBuild it in the muonps repository with `{BUILD_COMMAND}` "
            "(then `pip install client/python` copies it into the package), "
            "or set MUONPS_LIB to its path.")


def version():
    return load_library().muonps_version().decode()


class NativeClient:
    """One muonps_client handle: declare, start, lend buffers, step."""

    def __init__(self, coordinator, job, worker_socket, rank, world_size,
                 timeout_seconds, device="cpu"):
        self._lib = load_library()
        handle = _handle()
        code = self._lib.muonps_client_create_on(
            coordinator.encode(), job.encode(), worker_socket.encode(), rank,
            world_size, float(timeout_seconds), device.encode(),
            ctypes.byref(handle))
        if code != 0:
            raise MuonpsError(code, self._lib.muonps_last_create_error().decode())
        self._handle = handle

    def _check(self, code):
        if code != 0:
            message = self._lib.muonps_client_last_error(self._handle).decode()
            raise MuonpsError(code, message or CODE_NAMES.get(code, str(code)))

    def close(self):
        """Destroys the handle; its shared-memory segment is unlinked."""
        if self._handle:
            self._lib.muonps_client_destroy(self._handle)
            self._handle = None

    def add_matrix(self, name, rows, cols, experts, layout, layer):
        self._check(self._lib.muonps_client_add_matrix(
            self._handle, name.encode(), rows, cols, experts, layout, layer))

    def add_tensor(self, name, elements, layout):
        self._check(self._lib.muonps_client_add_tensor(
            self._handle, name.encode(), elements, layout))

    def start(self, lr, weight_decay, momentum, nesterov, ns_steps,
              adjust_lr_fn, adamw_lr, betas, eps, adamw_weight_decay,
              ns_algorithm=NS_AUTO, ns_eps=1e-7,
              ns_coefficients=(3.4445, -4.775, 2.0315)):
        muon = _MuonHyper(lr, weight_decay, momentum, int(bool(nesterov)),
                          ns_steps, adjust_lr_fn, ns_algorithm, 0, ns_eps,
                          (ctypes.c_double * 3)(*ns_coefficients))
        adamw = _AdamWHyper(adamw_lr, betas[0], betas[1], eps,
                            adamw_weight_decay)
        self._check(self._lib.muonps_client_start(
            self._handle, ctypes.byref(muon), ctypes.byref(adamw)))

    def buffers(self, name):
        """(param address, grad address, elements) of a declared tensor."""
        param, grad = _f32p(), _f32p()
        elements, begin, end = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        self._check(self._lib.muonps_client_buffers(
            self._handle, name.encode(), ctypes.byref(param), ctypes.byref(grad),
            ctypes.byref(elements), ctypes.byref(begin), ctypes.byref(end)))
        return (ctypes.cast(param, ctypes.c_void_p).value,
                ctypes.cast(grad, ctypes.c_void_p).value, elements.value)

    def step(self, step_id, groups, stream=0, async_=False,
             forward_waits=False):
        """One step with each param group's values by index: `groups` holds
        (lr, weight_decay, adamw_lr, adamw_weight_decay) per group (< 0
        keeps the job's default), the groups set_group filled. `stream`
        and `async_`: CUDA trainers (the gradients' cudaStream_t; return
        once enqueued); `forward_waits` (with async_): the stream does not
        wait for the step, wait_for_parameters does where the parameters
        are read. Returns a StepOutcome."""
        count = len(groups)
        columns = list(zip(*groups)) if groups else [(), (), (), ()]
        arrays = [(ctypes.c_double * max(1, count))(*map(float, column))
                  for column in columns]
        options = _StepOptions(-1.0, -1.0, -1.0, count, arrays[0], arrays[1],
                               int(stream),
                               2 if async_ and forward_waits
                               else int(bool(async_)), arrays[2],
                               arrays[3])
        result = _StepResult()
        self._check(self._lib.muonps_client_step_with(
            self._handle, step_id, ctypes.byref(options), ctypes.byref(result)))
        return _outcome(result)

    def set_last_adamw_step(self, step_id):
        """The last step id whose AdamW part the restored state includes."""
        self._check(self._lib.muonps_client_set_last_adamw_step(
            self._handle, step_id))

    def lend_cuda(self, name, grad, param, dtype="fp32"):
        """Lends a matrix's CUDA gradient and parameter tensors, both of
        `dtype` ("fp32" or "bf16"). `grad` None (job matrices): no gradient
        buffer; every step places the gradient (place_gradient)."""
        self._check(self._lib.muonps_client_lend_cuda(
            self._handle, name.encode(), 0 if grad is None else grad.data_ptr(),
            param.data_ptr(), dtype.encode()))

    def gradient_ready(self, name, stream):
        """CUDA trainers, after start: matrix `name`'s gradient is final for
        the next step once `stream` (a cudaStream_t as an int; 0: the legacy
        default stream) gets here. Records the matrix's own event on it, so
        the worker starts on it during backward; waits first for the answer
        to an async step still unanswered. May run on another thread than
        the other calls (a gradient hook's)."""
        self._check(self._lib.muonps_client_gradient_ready(
            self._handle, name.encode(), stream or None))

    def place_gradient(self, name, grad):
        """CUDA trainers, after start, for the next step only: matrix
        `name`'s gradient is the CUDA tensor `grad` (contiguous, of the lent
        dtype and size), which the worker reads in place instead of the lent
        buffer. Keep it alive and unwritten until the step is done."""
        self._check(self._lib.muonps_client_place_gradient(
            self._handle, name.encode(), grad.data_ptr()))

    def allocate_gradient(self, name):
        """CUDA trainers, after start: a CudaMemory of zeros for matrix
        `name`'s gradient (as many bytes as its lent gradient), which
        place_gradient always takes, whatever PyTorch's allocator settings
        (expandable segments cannot be lent). Freed when the CudaMemory and
        every tensor made over it are gone."""
        ptr = ctypes.c_uint64(0)
        self._check(self._lib.muonps_client_allocate_gradient(
            self._handle, name.encode(), ctypes.byref(ptr)))
        return CudaMemory(self._lib, ptr.value)

    def wait_for_parameters(self, stream, matrices=-1):
        """CUDA trainers whose steps return with forward_waits: `stream`
        (a cudaStream_t as an int) waits, on the device, until the last
        step has written the parameters of the first `matrices` declared
        matrices (-1: the whole step; 0: the gradients may be written
        again and the AdamW means are in place). Returns once enqueued."""
        self._check(self._lib.muonps_client_wait_for_parameters(
            self._handle, stream or None, int(matrices)))

    def expect_dedicated_workers(self, count):
        """The job expects `count` workers with no trainer (before start)."""
        self._check(self._lib.muonps_client_expect_dedicated_workers(
            self._handle, count))

    def set_replicas(self, replicas):
        """HSDP (before start and before any row-sharded matrix is
        added): the ranks form `replicas` replica groups of world_size /
        replicas ranks each (a row-major 2-D device mesh), a row-sharded
        matrix's rows split over the ranks of a group (this rank's shard:
        rank % (world_size / replicas)). 0 or 1: none."""
        self._check(self._lib.muonps_client_set_replicas(
            self._handle, replicas))

    def allow_momentum_reset(self, allow):
        """Whether the job may restart lost momentum at zero (before
        start; False by default: such a step raises)."""
        self._check(self._lib.muonps_client_allow_momentum_reset(
            self._handle, 1 if allow else 0))

    def set_checkpointing(self, directory, every):
        """Momentum checkpoints into `directory` every `every` steps
        (before start; 0: only on request)."""
        self._check(self._lib.muonps_client_set_checkpointing(
            self._handle, directory.encode(), every))

    def checkpoint(self):
        """Asks the local worker for a checkpoint after the next committed
        step; returns the last step it checkpointed (-1: none)."""
        last = _c_i64(-1)
        self._check(self._lib.muonps_client_checkpoint(
            self._handle, ctypes.byref(last)))
        return last.value

    def last_checkpoint_step(self):
        """The last step the local worker checkpointed (-1: none)."""
        step = _c_i64(-1)
        self._check(self._lib.muonps_client_last_checkpoint_step(
            self._handle, ctypes.byref(step)))
        return step.value

    def restore_checkpoint(self, directory, step):
        """The local worker restores the momentum it owns from checkpoint
        `step` of `directory`; returns how many experts."""
        restored = _c_i64(0)
        self._check(self._lib.muonps_client_restore_checkpoint(
            self._handle, directory.encode(), step, ctypes.byref(restored)))
        return restored.value

    def set_group(self, group, names):
        """Puts declared tensors (matrices and AdamW tensors) in param group
        `group` before start; each step's groups[group] applies to them."""
        array = (_c_str * max(1, len(names)))(*[n.encode() for n in names])
        self._check(self._lib.muonps_client_set_group(
            self._handle, group, array, len(names)))

    def wait(self):
        """Ends an async step; returns its StepOutcome."""
        result = _StepResult()
        self._check(self._lib.muonps_client_wait(self._handle,
                                                 ctypes.byref(result)))
        return _outcome(result)

    def get_momentum(self, name, expert, out):
        """Fills `out` (a contiguous fp32 tensor); False if another worker owns it."""
        code = self._lib.muonps_client_get_momentum(
            self._handle, name.encode(), expert, _as_f32p(out), out.numel())
        if code == NOT_FOUND:
            return False
        self._check(code)
        return True

    def set_momentum(self, name, expert, values):
        """Restores it; False if the local worker does not own it."""
        code = self._lib.muonps_client_set_momentum(
            self._handle, name.encode(), expert, _as_f32p(values), values.numel())
        if code == NOT_FOUND:
            return False
        self._check(code)
        return True

    def get_adamw(self, name, exp_avg, exp_avg_sq):
        """Fills the moments; returns the shared AdamW step count."""
        steps = ctypes.c_int64()
        self._check(self._lib.muonps_client_get_adamw(
            self._handle, name.encode(), _as_f32p(exp_avg), _as_f32p(exp_avg_sq),
            exp_avg.numel(), ctypes.byref(steps)))
        return steps.value

    def set_adamw(self, name, exp_avg, exp_avg_sq, steps):
        self._check(self._lib.muonps_client_set_adamw(
            self._handle, name.encode(), _as_f32p(exp_avg), _as_f32p(exp_avg_sq),
            exp_avg.numel(), steps))


def _outcome(result):
    return StepOutcome(bool(result.pending), bool(result.already_applied),
                       bool(result.adamw_applied), int(result.momentum_reset))


def _as_f32p(tensor):
    return ctypes.cast(ctypes.c_void_p(tensor.data_ptr()), _f32p)
