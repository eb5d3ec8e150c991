"""Console entry points of the wheel: `muonps-coordinator`, `muonps-worker`
and `muonps` run the binaries the package carries (see _service.find_binary
for where they are looked for), with this process's arguments."""

import os
import sys

from . import _service


def _exec(name):
    try:
        path = _service.find_binary(name)
    except _service.ServiceError as e:
        sys.exit(str(e))
    os.execv(str(path), [name] + sys.argv[1:])


def coordinator():
    _exec("muonps-coordinator")


def worker():
    _exec("muonps-worker")


def cli():
    _exec("muonps")
