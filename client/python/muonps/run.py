"""`python -m muonps.run [torchrun options] SCRIPT [ARGS...]`: torchrun for a
script that uses muonps.Muon, with its service set up.

With no $MUONPS_COORDINATOR, it starts a coordinator on loopback for the run
(stopped when the run ends) and names a fresh job; either way every rank
then starts its own muonps-worker as a child ($MUONPS_LOCAL_WORKERS=1), so
the script needs nothing but `muonps.Muon(model.parameters(), lr=...)`.
One node: for several, start a coordinator every node reaches and set
$MUONPS_COORDINATOR (and $MUONPS_JOB) on each.
"""

import os
import sys

from . import _service


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    service = None
    if not os.environ.get("MUONPS_COORDINATOR"):
        service = _service.LocalService(device=None)
        os.environ["MUONPS_COORDINATOR"] = service.coordinator
        os.environ["MUONPS_JOB"] = service.job
        os.environ["MUONPS_TOKEN_FILE"] = service.token_file
    os.environ["MUONPS_LOCAL_WORKERS"] = "1"
    try:
        from torch.distributed.run import main as torchrun
        torchrun(argv)
    finally:
        if service is not None:
            service.close()


if __name__ == "__main__":
    main()
