"""A neighbour on one GPU: bf16 GEMMs for part of each period, idle the rest.

Stands for what makes one GPU of a job slower than its peers in training (a
co-located process, a colder or power-capped chip): the kernels of two
processes on one GPU time-slice. Used by bench/step_gpu to show plans that
weigh measured speeds; prints the GEMM time it ran, as JSON, when stopped.

  python3 gpu_load.py --device 1 --busy_ms 2 --period_ms 6 --seconds 120
"""
import argparse
import json
import signal
import sys
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", type=int, default=1)
    p.add_argument("--busy_ms", type=float, default=2.0)
    p.add_argument("--period_ms", type=float, default=6.0)
    p.add_argument("--seconds", type=float, default=120.0)
    a = p.parse_args()
    torch.cuda.set_device(a.device)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    end = time.time() + a.seconds
    busy = 0.0
    start = time.time()
    while not stop and time.time() < end:
        t = time.time()
        while (time.time() - t) * 1e3 < a.busy_ms:
            for _ in range(4):
                x = (x @ x) * 1e-3
            torch.cuda.synchronize()
        busy += time.time() - t
        time.sleep(max(0.0, (a.period_ms - a.busy_ms) / 1e3))
    wall = time.time() - start
    print(json.dumps({"what": "gpu_load", "device": a.device,
                      "busy_fraction": busy / wall, "seconds": wall}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
