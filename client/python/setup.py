"""Installs the pure-Python package and, when Bazel has built them, copies of
libmuonps.so (as muonps/lib/libmuonps.so) and of the service's binaries
muonps-coordinator, muonps-worker and muonps (as muonps/bin/*), so that the
installed package starts its private service (zero setup) from any folder;
no compiler runs at install time.

The library copied is $MUONPS_LIB if set, else <repo>/bazel-bin/client/
libmuonps.so; the binaries come from $MUONPS_BIN_DIR if set, else
<repo>/bazel-bin/{server/coordinator,server/worker,tools/muonps}/ (build them
first: `bazel build //client:libmuonps.so //server/coordinator:muonps-coordinator
//server/worker:muonps-worker //tools/muonps`). Without them the package
still installs, and looks for them at run time (see muonps/_native.py and
muonps/_service.py). client/python/build_wheel.sh builds the wheel that
carries them together with the shared libraries they link.
"""

import os
import pathlib
import shutil

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
# The C ABI's entry point: a library without it was linked without the ABI.
ABI_SYMBOL = b"muonps_client_create"


# The service's binaries and where Bazel puts them (muonps/_service.py
# looks for them in the same places).
BINARIES = {"muonps-coordinator": "server/coordinator",
            "muonps-worker": "server/worker", "muonps": "tools/muonps"}


def built_library():
    if os.environ.get("MUONPS_LIB"):
        return pathlib.Path(os.environ["MUONPS_LIB"])
    return HERE.parents[1] / "bazel-bin" / "client" / "libmuonps.so"


def built_binary(name):
    if os.environ.get("MUONPS_BIN_DIR"):
        return pathlib.Path(os.environ["MUONPS_BIN_DIR"]) / name
    return HERE.parents[1] / "bazel-bin" / BINARIES[name] / name


class BuildPyWithLibrary(build_py):
    """build_py, then copies the Bazel-built library and binaries into the
    package."""

    def run(self):
        super().run()
        self.copy_library()
        for name in BINARIES:
            self.copy_binary(name)

    def copy_binary(self, name):
        if (HERE / "muonps" / "bin" / name).is_file():
            return  # staged by build_wheel.sh, with its libraries
        target = pathlib.Path(self.build_lib) / "muonps" / "bin" / name
        source = built_binary(name)
        target.unlink(missing_ok=True)  # never ship a stale copy
        if not source.is_file():
            self.warn(f"{source} is absent: installing without {name} (a "
                      "muonps.Muon with no coordinator then looks for it in "
                      "$MUONPS_BIN_DIR; run `bazel build //server/coordinator:"
                      "muonps-coordinator //server/worker:muonps-worker "
                      "//tools/muonps` and reinstall)")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o755)
        self.announce(f"copied {source} to {target}", level=2)

    def copy_library(self):
        target = pathlib.Path(self.build_lib) / "muonps" / "lib" / "libmuonps.so"
        target.unlink(missing_ok=True)  # never ship a stale copy
        source = built_library()
        if not source.is_file():
            self.warn(f"{source} is absent: installing without the library "
                      "(set MUONPS_LIB at run time, or run `bazel build "
                      "//client:libmuonps.so` and reinstall)")
            return
        if ABI_SYMBOL not in source.read_bytes():
            self.warn(f"{source} does not export muonps's C ABI (client/BUILD's "
                      "muonps_c needs alwayslink = True): not copied")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o755)
        self.announce(f"copied {source} to {target}", level=2)


class Distribution(setuptools.Distribution):
    """Platform-specific when the service's binaries travel with the package
    (client/python/build_wheel.sh stages them in muonps/bin)."""

    def has_ext_modules(self):
        return (HERE / "muonps" / "bin").is_dir()


COMMANDS = {"build_py": BuildPyWithLibrary}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """Any Python 3 (ctypes, no extension module), this platform: the
        binaries need glibc 2.36 (Debian 12) or newer."""

        def get_tag(self):
            _, _, platform = super().get_tag()
            if platform == "linux_x86_64":
                platform = "manylinux_2_36_x86_64"
            return "py3", "none", platform

    COMMANDS["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: sdist and plain installs still work
    pass


setup(packages=["muonps"], cmdclass=COMMANDS,
      distclass=Distribution,
      package_data={"muonps": ["bin/*", "lib/*"]})
