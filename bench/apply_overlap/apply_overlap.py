"""What applying the updates costs Newton-Schulz when they run at once.

A step commits by applying every update to its parameter: param <- param *
decay + step * update, fp32 parameters and 16-bit updates, 10 bytes of HBM
traffic per parameter (1.74 B parameters for 8 Llama-3-8B layers: 17.4 GB,
3.6 ms at 4.8 TB/s). Today that runs after the last stack's Newton-Schulz.
Applying each stack's updates while the next stack's Newton-Schulz runs
would hide it only if the GEMMs beside it do not slow down by as much.

This bench measures that on one GPU, in one process:

  gemm_alone    a loop of bf16 GEMMs of the set's shapes (Newton-Schulz is
                GEMMs), one "stack" of GEMMs per matrix
  apply_alone   the apply of every matrix (param.add_(update, alpha=step):
                one kernel, the fused apply's bytes)
  serial        the two one after the other on one stream (today)
  beside        each matrix's apply on a second stream once its GEMMs are
                done, while the next matrix's GEMMs run (per-stack apply)
  beside_low    the same with the apply stream at low priority

Prints one JSON line per measurement: the median ms over --iters, and for
the overlapped ones what they hide against serial and the GEMMs' slowdown.
Limits stated beside: the HBM bytes of the apply at the datasheet bandwidth
(--hbm_tbs) and the GEMMs' FLOPs at the measured rate of gemm_alone.

  python3 bench/apply_overlap/apply_overlap.py [--iters 5] [--layers 8]
"""
import argparse
import json
import statistics

import torch

# 8 layers of Llama-3-8B: q, k, v, o, gate, up, down (rows x cols).
LAYER = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
         (14336, 4096), (14336, 4096), (4096, 14336)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--gemms", type=int, default=6,
                        help="GEMMs per matrix (its Newton-Schulz stand-in)")
    parser.add_argument("--hbm_tbs", type=float, default=4.8,
                        help="HBM bandwidth for the stated limit (datasheet)")
    args = parser.parse_args()
    device = torch.device("cuda")
    shapes = LAYER * args.layers
    params = [torch.randn(r, c, device=device) for r, c in shapes]
    updates = [torch.randn(r, c, device=device).bfloat16() for r, c in shapes]
    # The GEMMs of a matrix: X X^T-like products on its wide orientation.
    xs = [torch.randn(min(r, c), max(r, c), device=device).bfloat16()
          for r, c in shapes]
    grams = [torch.empty(x.shape[0], x.shape[0], device=device,
                         dtype=torch.bfloat16) for x in xs]
    main_stream = torch.cuda.current_stream()
    work, side = torch.cuda.Stream(), torch.cuda.Stream()
    # Lower numbers are higher priorities: the GEMMs' blocks go first.
    low = torch.cuda.Stream(priority=0)
    high = torch.cuda.Stream(priority=-1)

    def gemms(k):
        for _ in range(args.gemms):
            torch.mm(xs[k], xs[k].t(), out=grams[k])

    def apply(k):
        params[k].add_(updates[k], alpha=-1e-3)

    def timed(run):
        times = []
        for i in range(args.iters + 1):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            if i > 0:  # the first is a warm-up
                times.append(start.elapsed_time(end))
        return statistics.median(times)

    def gemm_alone():
        for k in range(len(shapes)):
            gemms(k)

    def apply_alone():
        for k in range(len(shapes)):
            apply(k)

    def serial():
        gemm_alone()
        apply_alone()

    def beside(apply_stream, gemm_stream):
        def run():
            gemm_stream.wait_stream(main_stream)
            apply_stream.wait_stream(main_stream)
            for k in range(len(shapes)):
                with torch.cuda.stream(gemm_stream):
                    gemms(k)
                    done = torch.cuda.Event()
                    done.record(gemm_stream)
                apply_stream.wait_event(done)
                with torch.cuda.stream(apply_stream):
                    apply(k)
            main_stream.wait_stream(gemm_stream)
            main_stream.wait_stream(apply_stream)
        return run

    flops = sum(2.0 * x.shape[0] * x.shape[0] * x.shape[1] * args.gemms
                for x in xs)
    apply_bytes = sum(p.numel() * 10 for p in params)
    results = {}
    for name, run in [("gemm_alone", gemm_alone), ("apply_alone", apply_alone),
                      ("serial", serial), ("beside", beside(side, work)),
                      ("beside_low", beside(low, high))]:
        results[name] = timed(run)
    gemm_tflops = flops / results["gemm_alone"] / 1e9
    for name, ms in results.items():
        line = {"what": "apply_overlap", "measure": name, "ms": round(ms, 3),
                "matrices": len(shapes),
                "parameters": sum(p.numel() for p in params),
                "gemm_tflops_alone": round(gemm_tflops, 1),
                "apply_floor_ms": round(apply_bytes / args.hbm_tbs / 1e9, 3),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__}
        if name.startswith("beside"):
            line["hidden_ms"] = round(results["serial"] - ms, 3)
            line["hidden_of_apply"] = round(
                (results["serial"] - ms) / results["apply_alone"], 3)
            line["over_gemm_alone_ms"] = round(ms - results["gemm_alone"], 3)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
