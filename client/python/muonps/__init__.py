"""muonps for PyTorch: `muonps.Muon` is a torch.optim.Optimizer with
torch.optim.Muon's semantics whose Newton-Schulz work runs on muonps workers.

    import muonps
    opt = muonps.Muon(model.named_parameters(), lr=0.02)

With no coordinator it starts a private one and a worker as child processes
(see muonps/_service.py); coordinator="HOST:PORT" joins a running service.

It loads muonps's C ABI (libmuonps.so) through ctypes: from $MUONPS_LIB,
the package's lib/ folder, or the repository's bazel-bin/ (build it with
`bazel build //client:libmuonps.so`).
"""

from ._native import LibraryNotFoundError, MuonpsError, load_library, version
from ._service import ServiceError
from .optimizer import Muon
from .qk_clip import QKClip
from .routing import default_is_matrix

__all__ = ["Muon", "MuonpsError", "LibraryNotFoundError", "QKClip",
           "ServiceError", "default_is_matrix", "load_library", "version"]
__version__ = "0.1.0"
