"""The torch that muonps needs, checked when muonps is imported.

The package declares no torch requirement (pip would refuse Debian's
python3-torch, 1.13.0a0, which is a pre-release of the minimum, and would
try to replace a torch it cannot see): `import muonps` checks the torch it
finds here instead and names the minimum when it is missing or too old.
"""

import re

MINIMUM = (1, 13)
MINIMUM_TEXT = ".".join(map(str, MINIMUM))
_INSTALL = ("install PyTorch: `pip install torch`, or on Debian/Ubuntu "
            "`apt-get install python3-torch` and a venv made with "
            "`python3 -m venv --system-site-packages`")


def release(version):
    """(major, minor) of a torch version string: "1.13.0a0+gitunknown" is
    (1, 13), as a pre-release of 1.13 works the same here."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(match[1]), int(match[2])) if match else None


def require_torch():
    """Imports torch; ImportError naming the minimum if it is missing or
    older than MINIMUM."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"muonps needs PyTorch (torch >= {MINIMUM_TEXT}), which this "
            f"Python cannot import ({e}): {_INSTALL}") from e
    found = release(getattr(torch, "__version__", ""))
    if found is not None and found < MINIMUM:
        raise ImportError(
            f"muonps needs torch >= {MINIMUM_TEXT}; this Python has torch "
            f"{torch.__version__} ({torch.__file__}): {_INSTALL}")
    return torch
