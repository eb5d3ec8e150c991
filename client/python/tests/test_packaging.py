"""`pip install` of the package, offline and without a compiler, copies the
library into the package, and the installed package loads that copy."""

import os
import shutil
import subprocess
import sys

import muonps
from conftest import PACKAGE_ROOT


def test_pip_install_copies_the_library_and_the_installed_package_loads_it(
        tmp_path):
    library = muonps.load_library()._name  # the one these tests use
    source = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, source, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "lib", "__pycache__"))
    target = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "MUONPS_LIB"}
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation",
         "--no-deps", "--no-index", "--target", str(target), str(source)],
        env=dict(env, MUONPS_LIB=library), check=True, capture_output=True)
    installed = target / "muonps" / "lib" / "libmuonps.so"
    assert installed.is_file()
    out = subprocess.run(
        [sys.executable, "-c", "import muonps; print(muonps.load_library()._name);"
         " print(muonps.version())"], cwd=tmp_path, check=True,
        capture_output=True, text=True,
        env=dict(env, PYTHONPATH=str(target))).stdout.split("\n")
    assert out[0] == str(installed)
    assert out[1].startswith("muonps ")


PROVIDED = ("linux-vdso", "ld-linux", "libc.", "libm.", "libpthread", "libdl.",
            "librt.", "libgcc_s", "libstdc++", "libcuda.", "libcudart",
            "libcublas", "libnccl")


def test_wheel_carries_the_service_and_trains_with_no_repository(tmp_path):
    """client/python/build_wheel.sh's wheel, pip-installed into a fresh venv
    (Debian's torch through --system-site-packages; nothing from the
    checkout), runs the three-line example with no other command: the
    library, the coordinator and the worker all come from the wheel, and
    every library they link resolves inside it or to the C runtime."""
    repo = PACKAGE_ROOT.parents[1]
    dist = tmp_path / "dist"
    subprocess.run(["bash", str(PACKAGE_ROOT / "build_wheel.sh"), str(dist)],
                   cwd=repo, check=True, capture_output=True)
    [wheel] = dist.glob("muonps-*-py3-none-manylinux_2_36_x86_64.whl")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                    str(venv)], check=True, capture_output=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MUONPS_") and k != "PYTHONPATH"}
    script = (
        "import os, torch, muonps\n"
        "model = torch.nn.Linear(16, 8)\n"
        "opt = muonps.Muon(model.parameters(), lr=0.02)\n"
        "model(torch.randn(4, 16)).square().sum().backward()\n"
        "opt.step()\n"
        "print(muonps.load_library()._name)\n"
        "for pid in opt._service.pids: print(os.readlink(f'/proc/{pid}/exe'))\n"
        "opt.close()\n")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script],
                         cwd=tmp_path, env=env, check=True,
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
