"""Installs the pure-Python package and, when Bazel has built it, a copy of
libmuonps.so as muonps/lib/libmuonps.so (no compiler runs at install time).

The library copied is $MUONPS_LIB if set, else <repo>/bazel-bin/client/
libmuonps.so (build it first: `bazel build //client:libmuonps.so`). Without
one the package still installs, and finds the library at run time through
$MUONPS_LIB or the repository's bazel-bin/ (see muonps/_native.py).
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


def built_library():
    if os.environ.get("MUONPS_LIB"):
        return pathlib.Path(os.environ["MUONPS_LIB"])
    return HERE.parents[1] / "bazel-bin" / "client" / "libmuonps.so"


class BuildPyWithLibrary(build_py):
    """build_py, then copies the Bazel-built library into the package."""

    def run(self):
        super().run()
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
