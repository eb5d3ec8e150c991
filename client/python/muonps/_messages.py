"""Start-up errors that say which muonps service is missing or refused this
client, and the command that fixes it, as it can be pasted: the binary's
path or name on PATH, and the flags the binary needs (a coordinator on
loopback without TLS needs --insecure), with the credentials this process
uses ($MUONPS_TOKEN_FILE, $MUONPS_TLS_CA_FILE) where the service needs them.
"""

import ipaddress
import os
import re
import shlex
import shutil

from . import _native, _service

_UNREACHABLE = (_native.UNAVAILABLE, _native.DEADLINE_EXCEEDED)
# A worker refuses to attach (FAILED_PRECONDITION) while the job's plan has
# another number of workers than there are trainers (StepEngine::Attach);
# the client retries until its timeout, then this is what it reports.
_PLAN_SIZE = re.compile(
    r"has (\d+) workers with trainers and (\d+) dedicated ones; the job has "
    r"(\d+) trainers and expects (\d+) dedicated")
_SUBDIRS = {"muonps-coordinator": "server/coordinator",
            "muonps-worker": "server/worker"}
# gRPC targets that are not HOST:PORT (passed through unchecked).
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:",
            "xds:")
_TOKEN = "MUONPS_TOKEN_FILE"
_CA = "MUONPS_TLS_CA_FILE"
_LAUNCH = ("deploy/local/launch.sh --keep-running prints the two `export` "
           "lines of the cluster it starts")


def split_address(address):
    """(host, port) of "HOST:PORT" or "[V6]:PORT" (the host as written);
    None for a gRPC target
    with a scheme ("dns:///host:port", ...); ValueError naming what is
    expected otherwise."""
    text = str(address).strip()
    if text.startswith(_SCHEMES) and not text.split(":", 1)[1].isdigit():
        return None
    host, colon, port = text.rpartition(":")
    if (not colon or not host.strip("[]") or not port.isdigit() or
            not 0 < int(port) < 65536 or "/" in host or
            any(c.isspace() for c in text)):
        raise ValueError(
            f"{text!r} is not a coordinator address: expected HOST:PORT, "
            "e.g. '127.0.0.1:7070' (the host and port a muonps-coordinator "
            "listens on; its log says `listening on HOST:PORT`)")
    return host, int(port)


def check_address(address, source):
    """ValueError naming `source` (the argument or the variable it came
    from) when `address` is not HOST:PORT."""
    try:
        split_address(address)
    except ValueError as e:
        raise ValueError(f"muonps.Muon: {source}: {e}") from None


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _command(name):
    """How to run binary `name` here: its name when on PATH, else its path
    (the package's copy or the checkout's bazel-bin), else bazel-bin's
    relative path."""
    if shutil.which(name):
        return name
    try:
        return shlex.quote(str(_service.find_binary(name)))
    except _service.ServiceError:
        return f"bazel-bin/{_SUBDIRS[name]}/{name}"


def _build_note(name):
    """Where the binary comes from, when it is not found anywhere."""
    try:
        _service.find_binary(name)
        return ""
    except _service.ServiceError:
        return (f" (build it first in the muonps repository: `bazel build "
                f"//{_SUBDIRS[name]}:{name}`, or install the muonps wheel)")


def _credentials_env():
    """`VAR=path ` for each credential this process uses, so that a service
    started from the printed command uses the same ones."""
    return "".join(f"{var}={shlex.quote(os.path.abspath(os.environ[var]))} "
                   for var in (_TOKEN, _CA) if os.environ.get(var))


def coordinator_command(coordinator):
    """A command that starts a coordinator this client can reach at
    `coordinator`, as it can be pasted."""
    where = split_address(coordinator)
    if where is None:  # a gRPC target: "dns:///HOST:PORT", "ipv4:HOST:PORT"
        try:
            where = split_address(
                coordinator.rsplit("/", 1)[-1].split(":", 1)[-1]
                if "/" not in coordinator else coordinator.rsplit("/", 1)[-1])
        except ValueError:
            where = None
    host, port = where if where else ("127.0.0.1", 7070)
    binary = _command("muonps-coordinator")
    token, ca = (os.path.abspath(os.environ[var]) if os.environ.get(var)
                 else None for var in (_TOKEN, _CA))
    token_flag = f" --token_file {shlex.quote(token)}" if token else ""
    if _is_loopback(host) and not ca:
        return (f"`{binary} --host {host} --port {port} --insecure"
                f"{token_flag}`{_build_note('muonps-coordinator')} (plaintext "
                "on loopback; a coordinator other hosts reach needs TLS)")
    # TLS: deploy/local/make_credentials.sh writes the server's certificate
    # and key beside the CA.
    folder = os.path.dirname(ca) if ca else "/tmp/muonps-credentials"
    q = shlex.quote
    listen = "0.0.0.0" if not _is_loopback(host) else host
    start = (f"{binary} --host {listen} --port {port} --tls_cert_file "
             f"{q(os.path.join(folder, 'server.pem'))} --tls_key_file "
             f"{q(os.path.join(folder, 'server.key'))} --token_file "
             f"{q(token or os.path.join(folder, 'token'))}")
    made = ca and os.path.isfile(os.path.join(folder, "server.pem"))
    make = "" if made else (
        f"`bash deploy/local/make_credentials.sh {q(folder)} {host}` (from "
        f"the muonps repository: a CA, a certificate for {host} and a token), "
        "then ")
    export = "" if (ca and token) else (
        f", and here `export {_CA}={q(os.path.join(folder, 'ca.pem'))} "
        f"{_TOKEN}={q(token or os.path.join(folder, 'token'))}`")
    on = "" if _is_loopback(host) else (
        f" on {host}" + (f" (server.pem must name {host})" if made else ""))
    return (f"{make}`{start}`{on}{_build_note('muonps-coordinator')}"
            f"{export}")


def worker_command(coordinator, job, socket, device):
    binary = _command("muonps-worker")
    q = shlex.quote
    return (f"`{_credentials_env()}{binary} --coordinator {q(coordinator)} "
            f"--job {q(job)} --socket {q(socket)} --device {device}`"
            f"{_build_note('muonps-worker')} (one per trainer rank)")


def _coordinator_problem(error, coordinator):
    """A reworded MuonpsError for a failed CreateJob/GetJob, or None."""
    message = str(error)
    token, ca = os.environ.get(_TOKEN), os.environ.get(_CA)
    lowered = message.lower()
    if error.code == _native.UNAUTHENTICATED:
        if not token:
            return (f"the muonps coordinator at {coordinator} requires a "
                    f"bearer token and this process has none ({message}): "
                    f"export {_TOKEN}=<the file its --token_file names> "
                    f"({_LAUNCH})")
        return (f"the muonps coordinator at {coordinator} refused the token "
                f"in {_TOKEN}={token} ({message}): point {_TOKEN} at the file "
                "its --token_file names")
    if error.code not in _UNREACHABLE:
        return None
    if "dns resolution failed" in lowered:
        return (f"cannot resolve the host of coordinator {coordinator!r} "
                f"({message}): check the name, or pass the address the "
                "coordinator's log shows (`listening on HOST:PORT`)")
    if "handshake" in lowered or "ssl" in lowered:
        if "wrong version number" in lowered or "record layer" in lowered:
            return (f"the muonps coordinator at {coordinator} does not speak "
                    f"TLS, and {_CA}={ca} makes this client use TLS "
                    f"({message}): unset {_CA} for a coordinator started "
                    "with --insecure, or start it with --tls_cert_file and "
                    "--tls_key_file")
        if "certificate verify failed" in lowered:
            return (f"the TLS certificate of the muonps coordinator at "
                    f"{coordinator} is not signed by the CA in {_CA}={ca} "
                    f"({message}): point {_CA} at the CA that signed its "
                    "--tls_cert_file (make_credentials.sh writes ca.pem "
                    f"beside server.pem; {_LAUNCH})")
        return (f"the TLS handshake with the muonps coordinator at "
                f"{coordinator} failed ({message}): check {_CA}={ca} against "
                "the coordinator's --tls_cert_file")
    start = (f"start one: {coordinator_command(coordinator)}; or leave out "
             "coordinator= (and MUONPS_COORDINATOR), and muonps.Muon starts "
             "a private coordinator and worker itself")
    if "connection refused" in lowered:
        return (f"no muonps coordinator listens at {coordinator} ({message}): "
                f"{start}")
    if not ca:
        # Plaintext against a TLS server: the server closes the connection
        # ("Socket closed"), which gRPC reports as UNAVAILABLE.
        return (f"the muonps coordinator at {coordinator} could not be "
                f"reached over plaintext gRPC ({message}). Is it a TLS "
                f"coordinator? Set {_CA} to the CA that signed its "
                f"certificate (and {_TOKEN} to its token; {_LAUNCH}). If "
                f"nothing runs there, {start}")
    return (f"no muonps coordinator answered at {coordinator} ({message}): "
            f"{start}")


def _worker_problem(error, coordinator, job, socket, device):
    """A reworded MuonpsError for a failed Attach, or None."""
    message = str(error)
    start = worker_command(coordinator, job, socket, device)
    if error.code == _native.UNAUTHENTICATED:
        token = os.environ.get(_TOKEN)
        if not token:
            return (f"the muonps worker at unix:{socket} requires a bearer "
                    f"token and this process has none ({message}): export "
                    f"{_TOKEN}=<the file the worker's --token_file or "
                    f"{_TOKEN} names>")
        return (f"the muonps worker at unix:{socket} refused the token in "
                f"{_TOKEN}={token} ({message}): point {_TOKEN} at the file "
                f"the worker's --token_file or {_TOKEN} names")
    if error.code in _UNREACHABLE:
        return (f"no muonps worker at unix:{socket} ({message}): start "
                f"{start}, or pass worker_socket=PATH")
    sizes = _PLAN_SIZE.search(message)
    if error.code == _native.FAILED_PRECONDITION and sizes is not None:
        dedicated = (f" and {sizes[2]} of {sizes[4]} dedicated worker(s) "
                     "(muonps-worker --dedicated)"
                     if sizes[2] != sizes[4] else "")
        return (f"job {job!r} has {sizes[1]} worker(s) for {sizes[3]} "
                f"trainers{dedicated} ({message}); start one worker per "
                f"trainer rank, each with --job {job}: {start}")
    if error.code == _native.FAILED_PRECONDITION:
        return (f"the muonps worker at unix:{socket} has no plan for job "
                f"{job!r} ({message}): is it a worker of another job or "
                f"coordinator? Start {start}")
    return None


def explain_start_error(error, coordinator, job, socket, device="cpu"):
    """A MuonpsError from creating or starting a client, reworded when the
    coordinator or the worker could not be reached or refused this client
    (or the worker serves another job); any other error is returned as
    is."""
    message = str(error)
    reworded = None
    for prefix, var in (("tls_ca_file:", _CA), ("token_file:", _TOKEN)):
        if message.startswith(prefix) and os.environ.get(var):
            reworded = f"{var}={os.environ[var]}: {message[len(prefix):].strip()}"
    if reworded is None and ("CreateJob" in message or "GetJob" in message):
        reworded = _coordinator_problem(error, coordinator)
        if (reworded is None and error.code == _native.FAILED_PRECONDITION
                and "exists with other matrices or hyperparameters" in message):
            reworded = (
                f"{message}: a job's matrices and hyperparameters (lr and "
                f"weight decay included) are fixed when it is created, and "
                f"job {job!r} was created by an earlier run with others. "
                "Name a new job: start its workers with --job NAME and pass "
                "job='NAME' (or leave out coordinator= and muonps.Muon "
                "starts a private service)")
    if reworded is None and "Attach to the worker" in message:
        reworded = _worker_problem(error, coordinator, job, socket, device)
    if reworded is None:
        return error
    return _native.MuonpsError(error.code, reworded)
