"""Every hint is a command that works: the command a start-up error prints
to start the missing coordinator or worker starts it, as printed (plaintext
on loopback with --insecure, or TLS with the credentials this process
uses); an address that is not HOST:PORT is named as such; and a coordinator
that runs with TLS or a bearer token this process lacks is named as
running, with the variable to set (MUONPS_TLS_CA_FILE, MUONPS_TOKEN_FILE).
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import pytest
import torch

import muonps
from conftest import COORDINATOR_BIN, REPO, _require_binaries


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model():
    return [("w", torch.nn.Parameter(torch.randn(8, 4))),
            ("b", torch.nn.Parameter(torch.randn(4)))]


@pytest.fixture
def no_credentials(monkeypatch):
    """This process with no token or CA (the test session sets a token)."""
    _require_binaries()
    for var in ("MUONPS_TOKEN_FILE", "MUONPS_TLS_CA_FILE",
                "MUONPS_COORDINATOR"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


class Started:
    """Processes started from printed commands (through bash, as a user
    pastes them), stopped at the end of the test."""

    def __init__(self, folder):
        self.folder = folder
        self.processes = []

    def run(self, command, pattern, seconds=20):
        """Starts `command`; returns the first group of `pattern` in its
        output, or fails with the output's tail."""
        log = self.folder / f"started-{len(self.processes)}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", command], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ), start_new_session=True)
        self.processes.append(process)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            hit = re.search(pattern, text)
            if hit:
                return hit.group(1)
            if process.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"`{command}` (exit {process.poll()}) did not log "
                    f"/{pattern}/:\n{log.read_text(errors='replace')[-2000:]}")

    def stop(self):
        # Each command runs in its own session: its group is bash and what
        # it started.
        for p in self.processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def started(tmp_path):
    s = Started(tmp_path)
    yield s
    s.stop()


def start_error(coordinator, socket_path, **kwargs):
    with pytest.raises(muonps.MuonpsError) as raised:
        muonps.Muon(model(), coordinator=coordinator, job="hinted",
                    worker_socket=str(socket_path), timeout=3, **kwargs)
    return str(raised.value)


def printed_command(message, after):
    """The first `...` command after the text `after`."""
    hit = re.search(re.escape(after) + r"[^`]*`([^`]+)`", message)
    assert hit, message
    return hit.group(1)


def credentials(folder):
    subprocess.run(["bash", str(REPO / "deploy" / "local" /
                                "make_credentials.sh"), str(folder)],
                   check=True, capture_output=True)
    return folder


def test_the_coordinator_command_printed_starts_one_as_printed(
        no_credentials, started, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    message = start_error(address, tmp_path / "w.sock")
    assert f"no muonps coordinator listens at {address}" in message
    command = printed_command(message, "start one:")
    assert command.endswith("--insecure")
    listening = started.run(command, r"listening on (\S+)")
    assert listening == address
    # The same call now gets past the coordinator, to the missing worker.
    message = start_error(address, tmp_path / "w.sock")
    assert "no muonps worker at unix:" in message


def test_with_a_token_the_coordinator_command_checks_it(
        no_credentials, started, tmp_path):
    token = credentials(tmp_path / "creds") / "token"
    no_credentials.setenv("MUONPS_TOKEN_FILE", str(token))
    address = f"127.0.0.1:{free_port()}"
    command = printed_command(start_error(address, tmp_path / "w.sock"),
                              "start one:")
    assert f"--token_file {token}" in command
    assert "bearer token" in started.run(command, r"listening on \S+ (\(.*)")
    message = start_error(address, tmp_path / "w.sock")
    assert "no muonps worker at unix:" in message
    # The worker's command carries the token this process uses.
    command = printed_command(message, "start")
    assert command.startswith(f"MUONPS_TOKEN_FILE={token} ")
    started.run(command, r"listening on unix:(\S+)")
    muonps.Muon(model(), coordinator=address, job="hinted",
                worker_socket=str(tmp_path / "w.sock"), timeout=20).close()
    no_credentials.delenv("MUONPS_TOKEN_FILE")
    message = start_error(address, tmp_path / "w.sock")
    assert (f"the muonps coordinator at {address} requires a bearer token "
            "and this process has none") in message
    assert "export MUONPS_TOKEN_FILE=" in message


def test_with_tls_credentials_the_coordinator_command_serves_tls(
        no_credentials, started, tmp_path):
    creds = credentials(tmp_path / "creds")
    no_credentials.setenv("MUONPS_TOKEN_FILE", str(creds / "token"))
    no_credentials.setenv("MUONPS_TLS_CA_FILE", str(creds / "ca.pem"))
    address = f"127.0.0.1:{free_port()}"
    command = printed_command(start_error(address, tmp_path / "w.sock"),
                              "start one:")
    assert f"--tls_cert_file {creds / 'server.pem'}" in command
    assert "TLS, bearer token" in started.run(command,
                                              r"listening on \S+ \((.*)\)")
    message = start_error(address, tmp_path / "w.sock")
    assert "no muonps worker at unix:" in message


def test_the_worker_command_printed_starts_one_for_the_job(
        no_credentials, started, tmp_path):
    coordinator = started.run(
        f"{COORDINATOR_BIN} --port 0 --metrics_port -1 --insecure",
        r"listening on (\S+)")
    path = tmp_path / "w0.sock"
    message = start_error(coordinator, path)
    command = printed_command(message, "start")
    assert command.split()[-2:] == ["--device", "cpu"]
    started.run(command, r"listening on unix:(\S+)")
    opt = muonps.Muon(model(), coordinator=coordinator, job="hinted",
                      worker_socket=str(path), timeout=20)
    opt.close()


@pytest.mark.parametrize("address", ["nohost", "127.0.0.1", "host:port",
                                     "http://127.0.0.1:7070", ":7070",
                                     "127.0.0.1:0"])
def test_an_address_that_is_not_host_port_is_named_as_one(address,
                                                           no_credentials):
    with pytest.raises(ValueError, match=(
            rf"coordinator={re.escape(repr(address))}: .* is not a "
            r"coordinator address: expected HOST:PORT")):
        muonps.Muon(model(), coordinator=address)
    no_credentials.setenv("MUONPS_COORDINATOR", address)
    with pytest.raises(ValueError, match=(
            rf"MUONPS_COORDINATOR={re.escape(repr(address))}: .* expected "
            "HOST:PORT")):
        muonps.Muon(model())


@pytest.fixture
def tls_coordinator(no_credentials, started, tmp_path):
    """A coordinator serving TLS with a bearer token, as
    deploy/local/launch.sh starts one: (address, credentials folder)."""
    creds = credentials(tmp_path / "creds")
    address = started.run(
        f"{COORDINATOR_BIN} --port 0 --metrics_port -1 --tls_cert_file "
        f"{creds}/server.pem --tls_key_file {creds}/server.key --token_file "
        f"{creds}/token", r"listening on (\S+)")
    return address, creds


def test_a_tls_coordinator_without_its_ca_is_named_running(tls_coordinator,
                                                           tmp_path):
    address, creds = tls_coordinator
    message = start_error(address, tmp_path / "w.sock")
    assert "no muonps coordinator at" not in message
    assert "Is it a TLS coordinator? Set MUONPS_TLS_CA_FILE" in message


def test_a_token_coordinator_without_the_token_names_the_token(
        tls_coordinator, no_credentials, tmp_path):
    address, creds = tls_coordinator
    no_credentials.setenv("MUONPS_TLS_CA_FILE", str(creds / "ca.pem"))
    message = start_error(address, tmp_path / "w.sock")
    assert (f"the muonps coordinator at {address} requires a bearer token "
            "and this process has none") in message
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64 + "\n")
    no_credentials.setenv("MUONPS_TOKEN_FILE", str(wrong))
    message = start_error(address, tmp_path / "w.sock")
    assert f"refused the token in MUONPS_TOKEN_FILE={wrong}" in message
    no_credentials.setenv("MUONPS_TOKEN_FILE", str(creds / "token"))
    message = start_error(address, tmp_path / "w.sock")
    assert "no muonps worker at unix:" in message  # past the coordinator


def test_a_ca_that_did_not_sign_the_certificate_is_named(
        tls_coordinator, no_credentials, tmp_path):
    address, creds = tls_coordinator
    other = credentials(tmp_path / "other")
    no_credentials.setenv("MUONPS_TOKEN_FILE", str(creds / "token"))
    no_credentials.setenv("MUONPS_TLS_CA_FILE", str(other / "ca.pem"))
    message = start_error(address, tmp_path / "w.sock")
    assert ("is not signed by the CA in "
            f"MUONPS_TLS_CA_FILE={other / 'ca.pem'}") in message
    no_credentials.setenv("MUONPS_TLS_CA_FILE", str(tmp_path / "none.pem"))
    message = start_error(address, tmp_path / "w.sock")
    assert f"MUONPS_TLS_CA_FILE={tmp_path / 'none.pem'}: cannot read" in message


def test_a_ca_set_for_a_plaintext_coordinator_is_named(
        no_credentials, started, tmp_path):
    creds = credentials(tmp_path / "creds")
    address = started.run(
        f"{COORDINATOR_BIN} --port 0 --metrics_port -1 --insecure",
        r"listening on (\S+)")
    no_credentials.setenv("MUONPS_TLS_CA_FILE", str(creds / "ca.pem"))
    message = start_error(address, tmp_path / "w.sock")
    assert f"the muonps coordinator at {address} does not speak TLS" in message
    assert "unset MUONPS_TLS_CA_FILE" in message


def test_an_unknown_host_is_named(no_credentials, tmp_path):
    message = start_error("no-such-host.invalid:7070", tmp_path / "w.sock")
    assert "cannot resolve the host of coordinator" in message


def test_hints_name_no_file_outside_the_package_that_is_absent():
    # The binaries a hint names exist where it says, or the hint says how
    # to build them.
    from muonps import _messages
    for name in ("muonps-coordinator", "muonps-worker"):
        command = _messages._command(name)
        if command.startswith("bazel-bin/"):
            assert "bazel build" in _messages._build_note(name)
        elif "/" in command:
            assert pathlib.Path(command).is_file(), command
