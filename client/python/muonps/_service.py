"""A private muonps service for one training process: zero-setup Muon.

`muonps.Muon(params, lr=...)` with no coordinator (no `coordinator=` and no
$MUONPS_COORDINATOR) starts a `muonps-coordinator` and a `muonps-worker` on
loopback as children of this process, for this process's job alone, and stops
them when the optimizer is closed or the process exits. If the process dies
without cleaning up (kill -9), the kernel stops them too (PR_SET_PDEATHSIG).

The binaries come from, in order: $MUONPS_BIN_DIR, the installed package
(`muonps/bin`: the wheel carries them, and `pip install client/python` copies
the ones Bazel built), the checkout's `bazel-bin/` when the package is used
in place (PYTHONPATH=<repo>/client/python), or `./bazel-bin/`; so a script
finds them from any folder. Not thread-safe: the
optimizer's thread only (the children stop if the thread that started them
exits).
"""

import ctypes
import itertools
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

_BUILD = ("bazel build //server/coordinator:muonps-coordinator "
          "//server/worker:muonps-worker //tools/muonps")
_SUBDIRS = {"muonps-coordinator": "server/coordinator",
            "muonps-worker": "server/worker", "muonps": "tools/muonps"}
_START_SECONDS = 60.0
_jobs = itertools.count()
_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """The private service could not start; says which command fixes it."""


def binary_candidates(name, environ=None):
    """Where `name` (muonps-coordinator, muonps-worker, muonps) is looked
    for."""
    environ = os.environ if environ is None else environ
    package = pathlib.Path(__file__).resolve().parent
    paths = []
    if environ.get("MUONPS_BIN_DIR"):
        paths.append(pathlib.Path(environ["MUONPS_BIN_DIR"]) / name)
    # The wheel's (build_wheel.sh) or `pip install client/python`'s copy.
    paths.append(package / "bin" / name)
    roots = [pathlib.Path.cwd()]
    checkout = _checkout(package)
    if checkout is not None:  # used in place: <repo>/client/python/muonps
        roots.insert(0, checkout)
    for root in roots:
        path = root / "bazel-bin" / _SUBDIRS[name] / name
        if path not in paths:
            paths.append(path)
    return paths


def _checkout(package):
    """The repository the package sits in when used from a checkout
    (<repo>/client/python/muonps), else None."""
    root = package.parents[2]
    if (root / "client" / "python" / "muonps") == package:
        return root
    return None


def find_binary(name, environ=None):
    """The first executable candidate; ServiceError naming them otherwise."""
    tried = binary_candidates(name, environ)
    for path in tried:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ServiceError(
        f"muonps: no {name} binary; tried:\n  " +
        "\n  ".join(map(str, tried)) +
        "\nInstall the muonps wheel (it carries the binaries), or build them "
        f"in the repository with `{_BUILD}` and then `pip install "
        "client/python` again (it copies them), set MUONPS_BIN_DIR to their "
        "folder, or pass coordinator='HOST:PORT' (or set MUONPS_COORDINATOR) "
        "to use a running service")


def _die_with_parent():
    """In the child before exec: stop when the parent thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class LocalService:
    """Child processes of this one on loopback: a coordinator (unless
    `coordinator` names a running one, then `job` is its job) and a worker
    `worker_id` on `device` ("cpu" or "cuda:N"; None: no worker), for one
    job; `coordinator`, `job` and `socket` say where they are.

    A coordinator it starts requires a fresh bearer token (plaintext on
    loopback, `--insecure`), written to `token_file` (mode 0600, in a folder
    only this user reaches); `token` is its value, for other ranks. Joining a
    running coordinator, it uses `token` when given (another rank's), else
    $MUONPS_TOKEN_FILE. Its worker requires the same token on its socket.
    `environ()` is the environment its clients need."""

    def __init__(self, device="cpu", timeout=_START_SECONDS, environ=None,
                 coordinator=None, job=None, worker_id="w0", token=None):
        self._processes = []
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="muonps-local-"))
        self.job = job or f"local-{os.getpid()}-{next(_jobs)}"
        self.socket = str(self._dir / f"{worker_id}.sock")
        self.coordinator = coordinator
        self.token_file = (os.environ if environ is None else environ).get(
            "MUONPS_TOKEN_FILE")
        if coordinator is None or token is not None:
            self.token_file = str(self._dir / "token")
            descriptor = os.open(self.token_file,
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as f:
                f.write((token or secrets.token_hex(32)) + "\n")
        try:
            if coordinator is None:
                process = self._spawn("coordinator", [
                    find_binary("muonps-coordinator", environ), "--host",
                    "127.0.0.1", "--port", "0", "--metrics_port", "-1",
                    "--insecure"])
                self.coordinator = self._wait_for(
                    process, r"listening on ([0-9.]+:[0-9]+)", timeout)
            if device is not None:
                worker = self._spawn("worker", [
                    find_binary("muonps-worker", environ), "--coordinator",
                    self.coordinator, "--job", self.job, "--worker_id",
                    worker_id, "--socket", self.socket, "--metrics_port", "-1",
                    "--device", device,
                    # The job ends with this service: nothing to hand over.
                    "--drain_timeout", "0s"])
                self._wait_for(worker, r"listening on unix:(\S+)", timeout)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self):
        return [p.pid for p in self._processes]

    @property
    def token(self):
        """The bearer token's value (None when there is none)."""
        if not self.token_file:
            return None
        with open(self.token_file) as f:
            return f.readline().strip()

    def export_token(self):
        """Points this process's MUONPS_TOKEN_FILE (which its muonps::Client
        reads) at this service's token until close()."""
        if not self.token_file:
            return
        self._exported = (os.environ.get("MUONPS_TOKEN_FILE"),)
        os.environ["MUONPS_TOKEN_FILE"] = self.token_file

    def environ(self):
        """os.environ with MUONPS_TOKEN_FILE naming this service's token."""
        env = dict(os.environ)
        if self.token_file:
            env["MUONPS_TOKEN_FILE"] = self.token_file
        return env

    def _spawn(self, name, argv):
        log = open(self._dir / f"{name}.log", "wb")
        try:
            process = subprocess.Popen(
                [str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                env=self.environ())
        finally:
            log.close()
        process.log_path = self._dir / f"{name}.log"
        process.role = name
        self._processes.append(process)
        return process

    @staticmethod
    def _wait_for(process, pattern, timeout):
        deadline = time.monotonic() + timeout
        while True:
            text = process.log_path.read_text(errors="replace")
            match = re.search(pattern, text)
            if match:
                return match.group(1)
            if process.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {process.returncode}"
                       if process.poll() is not None
                       else f"did not start within {timeout:.0f} s")
                tail = "\n    ".join(text.strip().splitlines()[-8:])
                raise ServiceError(
                    f"muonps.Muon: the private muonps-{process.role} {why}; "
                    f"its log ({process.log_path}):\n    {tail}")
            time.sleep(0.05)

    def close(self):
        """Stops the children (TERM, then KILL after 5 s) and removes their
        folder. Idempotent."""
        for p in reversed(self._processes):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._processes):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._processes = []
        shutil.rmtree(self._dir, ignore_errors=True)
        exported = getattr(self, "_exported", None)
        if exported and os.environ.get("MUONPS_TOKEN_FILE") == self.token_file:
            if exported[0] is None:
                os.environ.pop("MUONPS_TOKEN_FILE", None)
            else:
                os.environ["MUONPS_TOKEN_FILE"] = exported[0]
        self._exported = None
