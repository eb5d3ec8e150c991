"""Installing muonps as a user does: `pip install client/python` (offline,
no compiler) copies the library and the service's binaries into the
package, and the installed package loads that library and starts its
private service from them, run from any folder; the wheel that
client/python/build_wheel.sh builds installs with a plain `pip install` over
Debian's torch (1.13.0a0, a pre-release) and trains with nothing else; and
`import muonps` names the torch it needs when there is none or it is too
old."""

import os
import shutil
import subprocess
import sys

import pytest

import muonps
from conftest import COORDINATOR_BIN, PACKAGE_ROOT, WORKER_BIN, _require_binaries

# Three lines of a user's script (zero setup), then what it ran.
SCRIPT = (
    "import os, torch, muonps\n"
    "model = torch.nn.Linear(16, 8)\n"
    "opt = muonps.Muon(model.parameters(), lr=0.02)\n"
    "model(torch.randn(4, 16)).square().sum().backward()\n"
    "opt.step()\n"
    "print(muonps.load_library()._name)\n"
    "for pid in opt._service.pids: print(os.readlink(f'/proc/{pid}/exe'))\n"
    "opt.close()\n")


def user_environment():
    """os.environ without muonps's variables or PYTHONPATH: nothing points
    at the checkout."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("MUONPS_") and k != "PYTHONPATH"}


def test_pip_install_copies_the_library_and_binaries_and_runs_from_anywhere(
        tmp_path):
    _require_binaries()
    library = muonps.load_library()._name  # the one these tests use
    source = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, source, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "lib", "bin", "__pycache__"))
    built = tmp_path / "built"  # the binaries these tests use, as Bazel's
    built.mkdir()
    for binary in (COORDINATOR_BIN, WORKER_BIN):
        (built / binary.name).symlink_to(binary)
    target = tmp_path / "site"
    env = user_environment()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        env=dict(env, MUONPS_LIB=library, MUONPS_BIN_DIR=str(built)),
        check=True, capture_output=True)
    package = target / "muonps"
    assert (package / "lib" / "libmuonps.so").is_file()
    for name in ("muonps-coordinator", "muonps-worker"):
        assert os.access(package / "bin" / name, os.X_OK), name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=elsewhere, check=True,
        capture_output=True, text=True,
        env=dict(env, PYTHONPATH=str(target))).stdout.split()
    assert out == [str(package / "lib" / "libmuonps.so"),
                   str(package / "bin" / "muonps-coordinator"),
                   str(package / "bin" / "muonps-worker")]
    out = subprocess.run(
        [sys.executable, "-c", "import muonps; print(muonps.version())"],
        cwd=elsewhere, check=True, capture_output=True, text=True,
        env=dict(env, PYTHONPATH=str(target))).stdout
    assert out.startswith("muonps ")


def test_the_checkout_on_pythonpath_runs_from_anywhere(tmp_path):
    # PYTHONPATH=<repo>/client/python, the script in another folder: the
    # private service's binaries come from the checkout's bazel-bin.
    _require_binaries()
    env = dict(user_environment(), PYTHONPATH=str(PACKAGE_ROOT))
    if os.environ.get("MUONPS_BAZEL_BIN") or os.environ.get("MUONPS_BIN_DIR"):
        pytest.skip("the binaries under test are not the checkout's")
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path,
                         check=True, capture_output=True, text=True,
                         env=env).stdout.split()
    # /proc/PID/exe names bazel-bin's target.
    assert out[1:] == [os.path.realpath(COORDINATOR_BIN),
                       os.path.realpath(WORKER_BIN)]


@pytest.mark.parametrize("version, accepted", [
    ("1.13.0a0+gitunknown", True), ("1.13.1", True), ("2.11.0+cu130", True),
    ("2.6.0.dev20250101", True), ("1.12.1", False), ("0.4.1", False)])
def test_import_accepts_torch_from_1_13_pre_releases_included(
        tmp_path, version, accepted):
    # A stand-in torch of `version` ahead of the real one on the path.
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    # The check alone (the rest of muonps needs a real torch).
    script = ("import importlib.util as u\n"
              f"spec = u.spec_from_file_location('check', "
              f"{str(PACKAGE_ROOT / 'muonps' / '_torch_check.py')!r})\n"
              "check = u.module_from_spec(spec)\n"
              "spec.loader.exec_module(check)\n"
              "try:\n    check.require_torch()\n    print('ok')\n"
              "except ImportError as e:\n    print(e)\n")
    env = dict(user_environment(), PYTHONPATH=os.pathsep.join(
        [str(fake), str(PACKAGE_ROOT)]))
    out = subprocess.run([sys.executable, "-c", script], check=True,
                         capture_output=True, text=True,
                         env=env).stdout.strip()
    if accepted:
        assert out == "ok"
        return
    assert f"muonps needs torch >= 1.13; this Python has torch {version}" \
        in out
    assert "pip install torch" in out
    # `import muonps` says the same, before anything else fails.
    run = subprocess.run([sys.executable, "-c", "import muonps"],
                         capture_output=True, text=True, env=env)
    assert run.returncode != 0
    assert (f"ImportError: muonps needs torch >= 1.13; this Python has torch "
            f"{version}") in run.stderr


def test_import_without_torch_names_the_minimum(tmp_path):
    # A torch that cannot be imported (as on a machine without PyTorch).
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "raise ImportError('No module named torch')\n")
    run = subprocess.run(
        [sys.executable, "-c", "import muonps"], capture_output=True,
        text=True, env=dict(user_environment(), PYTHONPATH=os.pathsep.join(
            [str(fake), str(PACKAGE_ROOT)])))
    assert run.returncode != 0
    assert ("ImportError: muonps needs PyTorch (torch >= 1.13), which this "
            "Python cannot import") in run.stderr
    assert "apt-get install python3-torch" in run.stderr


PROVIDED = ("linux-vdso", "ld-linux", "libc.", "libm.", "libpthread", "libdl.",
            "librt.", "libgcc_s", "libstdc++", "libcuda.", "libcudart",
            "libcublas", "libnccl")


def test_wheel_carries_the_service_and_trains_with_no_repository(tmp_path):
    """client/python/build_wheel.sh's wheel, installed with a plain `pip
    install` (no flags: it requires nothing that Debian's torch 1.13.0a0,
    seen through --system-site-packages, fails) into a fresh venv, runs the
    three-line example with no other command, from a folder outside the
    checkout: the library, the coordinator and the worker all come from the
    wheel, and every library they link resolves inside it or to the C
    runtime."""
    repo = PACKAGE_ROOT.parents[1]
    dist = tmp_path / "dist"
    subprocess.run(["bash", str(PACKAGE_ROOT / "build_wheel.sh"), str(dist)],
                   cwd=repo, check=True, capture_output=True)
    [wheel] = dist.glob("muonps-*-py3-none-manylinux_2_36_x86_64.whl")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                    str(venv)], check=True, capture_output=True)
    env = user_environment()
    install = subprocess.run([str(venv / "bin" / "pip"), "install",
                              str(wheel)], env=env, capture_output=True,
                             text=True)
    assert install.returncode == 0, install.stdout + install.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([str(venv / "bin" / "python"), "-c", SCRIPT],
                         cwd=elsewhere, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    [site] = venv.glob("lib/python3*/site-packages")
    package = site / "muonps"
    assert out[0] == str(package / "lib" / "libmuonps.so")
    assert out[1:] == [str(package / "bin" / "muonps-coordinator"),
                       str(package / "bin" / "muonps-worker")]
    for binary in [*package.glob("bin/*"), *package.glob("lib/*.so*")]:
        linked = subprocess.run(["ldd", str(binary)], capture_output=True,
                                text=True, env=env).stdout
        for line in linked.splitlines():
            name, _, where = line.strip().partition(" => ")
            if not where or name.startswith(PROVIDED):
                continue
            path = where.split(" (")[0]
            assert os.path.realpath(path).startswith(str(package / "lib")), (
                binary, line)
    # The console entry point runs the wheel's coordinator.
    coordinator = subprocess.Popen(
        [str(venv / "bin" / "muonps-coordinator"), "--port", "0",
         "--metrics_port", "-1", "--insecure"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        # --insecure logs its warning first.
        lines = [coordinator.stdout.readline() for _ in range(2)]
        assert any("listening on" in line for line in lines), lines
    finally:
        coordinator.kill()
        coordinator.wait()
