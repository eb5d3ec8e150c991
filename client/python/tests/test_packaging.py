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
