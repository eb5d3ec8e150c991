"""Fixtures: local muonps clusters made of the binaries Bazel built.

`cluster(workers=1)` starts a coordinator and N workers of a new job on
loopback (coordinator port picked by the OS, worker sockets in a fresh
folder under /tmp) and returns a `Cluster`; every process is stopped, every
socket folder removed and the job's /dev/shm segments checked (and removed)
when the test ends. Nothing is built here: run
`bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator
//server/worker:muonps-worker` first (or point $MUONPS_BAZEL_BIN at a copy).
"""

import atexit
import itertools
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
PACKAGE_ROOT = REPO / "client" / "python"
# $MUONPS_BAZEL_BIN: another folder laid out like bazel-bin (e.g. a copy that
# a concurrent `bazel build --config=sanitize` cannot swap out under the tests).
BIN = pathlib.Path(os.environ.get("MUONPS_BAZEL_BIN", REPO / "bazel-bin"))
COORDINATOR_BIN = BIN / "server" / "coordinator" / "muonps-coordinator"
WORKER_BIN = BIN / "server" / "worker" / "muonps-worker"
# $MUONPS_BIN_DIR: a flat folder of the binaries (a GPU machine's bundle).
if os.environ.get("MUONPS_BIN_DIR"):
    COORDINATOR_BIN = pathlib.Path(os.environ["MUONPS_BIN_DIR"]) / "muonps-coordinator"
    WORKER_BIN = pathlib.Path(os.environ["MUONPS_BIN_DIR"]) / "muonps-worker"
GOLDEN = REPO / "testdata" / "torch_optim_golden"
START_SECONDS = 20

sys.path.insert(0, str(PACKAGE_ROOT))
_jobs = itertools.count()


_token_dir = None


def _session_token_file():
    """A fresh bearer token for this test session, in a 0700 folder removed
    at exit; $MUONPS_TOKEN_FILE names it (clusters may overlap, so one token
    for all of them rather than one each)."""
    global _token_dir
    if _token_dir is None:
        _token_dir = pathlib.Path(tempfile.mkdtemp(prefix="mps-token-"))
        atexit.register(shutil.rmtree, _token_dir, True)
        token = _token_dir / "token"
        token.write_text(secrets.token_hex(32) + "\n")
        token.chmod(0o600)
    path = _token_dir / "token"
    os.environ["MUONPS_TOKEN_FILE"] = str(path)
    return path


class Cluster:
    """A coordinator and workers of one job; `sockets[i]` is worker i's.
    `device` is every worker's --device, or a list of one per worker."""

    def __init__(self, workers, log_dir, device="cpu", worker_args=(),
                 dedicated=0):
        self.job = f"pytest-{os.getpid()}-{next(_jobs)}"
        self.log_dir = log_dir
        self.socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
        self.processes = []
        self.sockets = []
        self.dedicated = dedicated
        # Secured as a private service is: a bearer token that the
        # coordinator, the workers' sockets and this process's clients use
        # (one per test session, see _session_token_file).
        self.token_file = _session_token_file()
        try:
            coordinator = self._spawn(
                "coordinator", [COORDINATOR_BIN, "--port", "0",
                                "--metrics_port", "-1", "--lease_ttl_ms", "3000",
                                "--heartbeat_interval_ms", "500", "--insecure"])
            port = self._wait_for(coordinator, r"listening on ([0-9.]+:[0-9]+)")
            self.coordinator = port
            devices = ([device] * workers if isinstance(device, str)
                       else list(device))
            for i, device in enumerate(devices):
                socket = str(self.socket_dir / f"w{i}.sock")
                self.sockets.append(socket)
                self._spawn(f"worker-w{i}", [
                    WORKER_BIN, "--coordinator", self.coordinator, "--job",
                    self.job, "--worker_id", f"w{i}", "--socket", socket,
                    "--metrics_port", "-1", "--device", device,
                    "--memory_bytes", str(0 if device != "cpu" else 1 << 30),
                    *worker_args])
            for i in range(dedicated):  # no trainer: a dedicated pool
                self._spawn(f"worker-d{i}", [
                    WORKER_BIN, "--coordinator", self.coordinator, "--job",
                    self.job, "--worker_id", f"d{i}", "--socket",
                    str(self.socket_dir / f"d{i}.sock"), "--metrics_port",
                    "-1", "--device", device, "--dedicated",
                    "--memory_bytes", str(0 if device != "cpu" else 1 << 30),
                    *worker_args])
            for process in self.processes[1:]:
                self._wait_for(process, r"listening on unix:(\S+)")
        except BaseException:
            self.stop()
            raise

    def options(self, rank=0, world_size=1):
        """Muon keyword arguments that reach this cluster as `rank`."""
        return dict(coordinator=self.coordinator, job=self.job,
                    worker_socket=self.sockets[rank], rank=rank,
                    world_size=world_size, dedicated_workers=self.dedicated)

    def _spawn(self, name, argv):
        log = open(self.log_dir / f"{self.job}-{name}.log", "wb")
        process = subprocess.Popen([str(a) for a in argv], stdout=log,
                                   stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        process.log_path = log.name
        log.close()
        self.processes.append(process)
        return process

    @staticmethod
    def _wait_for(process, pattern):
        deadline = time.monotonic() + START_SECONDS
        text = ""
        while time.monotonic() < deadline:
            text = pathlib.Path(process.log_path).read_text(errors="replace")
            match = re.search(pattern, text)
            if match:
                return match.group(1)
            if process.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{process.args[0]} did not log /{pattern}/ "
                           f"(exit {process.poll()}); log tail:\n{text[-2000:]}")

    def stop(self):
        """SIGTERM (then SIGKILL) every process, newest first, and reap it."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def leftover_segments(self):
        return sorted(pathlib.Path("/dev/shm").glob(f"muonps-{self.job}-*"))


def _require_binaries():
    missing = [str(p) for p in (COORDINATOR_BIN, WORKER_BIN) if not p.is_file()]
    if missing:
        pytest.fail("missing " + ", ".join(missing) + ": run `bazel build "
                    "//client:libmuonps.so //server/coordinator:muonps-coordinator"
                    " //server/worker:muonps-worker` first", pytrace=False)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """cluster(workers=1) -> a started Cluster, torn down after the test."""
    _require_binaries()
    import muonps
    started = []
    # Optimizers a test left open (a failed test's traceback keeps them) are
    # closed before their cluster stops.
    opened = weakref.WeakSet()
    construct = muonps.Muon.__init__

    def tracked(self, *args, **kwargs):
        opened.add(self)
        construct(self, *args, **kwargs)

    monkeypatch.setattr(muonps.Muon, "__init__", tracked)

    def start(workers=1, device="cpu", worker_args=(), dedicated=0):
        c = Cluster(workers, tmp_path, device, worker_args, dedicated)
        started.append(c)
        return c

    yield start
    for opt in list(opened):
        opt.close()
    leftovers = []
    for c in started:
        c.stop()
        for segment in c.leftover_segments():
            leftovers.append(str(segment))
            segment.unlink()
    assert not leftovers, f"shared memory left behind: {leftovers}"


@pytest.fixture
def private(monkeypatch, tmp_path):
    """muonps.Muon on its own: no coordinator in the environment, and the
    binaries the tests use where its private service looks for them."""
    _require_binaries()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "muonps-coordinator").symlink_to(COORDINATOR_BIN)
    (bin_dir / "muonps-worker").symlink_to(WORKER_BIN)
    monkeypatch.delenv("MUONPS_COORDINATOR", raising=False)
    monkeypatch.delenv("MUONPS_WORKER_SOCKET", raising=False)
    monkeypatch.setenv("MUONPS_BIN_DIR", str(bin_dir))
    return bin_dir
