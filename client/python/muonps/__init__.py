"""muonps for PyTorch: `muonps.Muon` is a torch.optim.Optimizer with
torch.optim.Muon's semantics whose Newton-Schulz work runs on muonps workers.

    import muonps
    opt = muonps.Muon(model.named_parameters(), lr=0.02)

With no coordinator it starts a private one and a worker as child processes
(see muonps/_service.py); coordinator="HOST:PORT" joins a running service.

It loads muonps's C ABI (libmuonps.so) through ctypes: from $MUONPS_LIB,
the package's lib/ folder, or the repository's bazel-bin/ (build it with
`bazel build //client:libmuonps.so`).

It needs torch >= 1.13 (Debian's 1.13.0a0 included), checked here rather
than required by the package (see muonps/_torch_check.py).
"""

from ._torch_check import require_torch as _require_torch

_require_torch()

# Imported once torch is known to be there.
from ._native import (LibraryNotFoundError, MuonpsError,  # noqa: E402
                      load_library, version)
from ._service import ServiceError  # noqa: E402
from .optimizer import Muon  # noqa: E402
from .qk_clip import QKClip  # noqa: E402
from .routing import default_is_matrix  # noqa: E402

__all__ = ["Muon", "MuonpsError", "LibraryNotFoundError", "QKClip",
           "ServiceError", "default_is_matrix", "load_library", "version"]
__version__ = "0.1.0"
