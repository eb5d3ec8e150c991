"""Ways to move the step's updates between the GPUs of one host, measured.

The replicated layout sends every owner's updates to every other GPU. This
bench times that phase for the 56 matrices of 8 Llama-3-8B layers (1.74 B
parameters) on two GPUs, each owning every other matrix, three ways and in
two precisions (fp32, bf16: the precision Newton-Schulz produces them in):

  per_matrix   one NCCL broadcast per matrix from its owner (the data path
               of today, step_transfers.cc)
  all_gather   one NCCL all_gather of each rank's owned updates, laid out
               contiguously
  peer_copy    copy-engine peer copies (cudaMemcpyPeerAsync through
               torch's device-to-device copy), both directions at once,
               no kernel and no SM

and what each costs a bf16 GEMM running at the same time on the same GPU
(Newton-Schulz is GEMMs): the GEMM loop's time alone and beside each. For
the unreduced layout, the fp32 gradients going to their owners: a reduce
per matrix against one reduce-scatter.

Run the NCCL half under torchrun on 2 GPUs, the peer half in one process:
  torchrun --standalone --nproc-per-node 2 transfer_paths.py nccl
  python3 transfer_paths.py peer
Prints one JSON line per measurement, with the ratios against per_matrix
and the link limit (NVLink of the machine, stated by the caller with
--link_gbps, per direction).
"""
import argparse
import json
import os
import time

import torch

# 8 layers of Llama-3-8B: q, k, v, o, gate, up, down (rows x cols).
LAYER = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
         (14336, 4096), (14336, 4096), (4096, 14336)]
SHAPES = LAYER * 8
REPEATS = 10
WARMUP = 3


def elements():
    return [r * c for r, c in SHAPES]


def timed(fn, stream=None, repeats=REPEATS, warmup=WARMUP):
    """Mean ms of fn() over `repeats` after `warmup`, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    s = stream or torch.cuda.current_stream()
    start.record(s)
    for _ in range(repeats):
        fn()
    end.record(s)
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def gemm_loop(device, iters):
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def run():
        for _ in range(iters):
            torch.mm(a, b)
    return run


def gemm_ms_beside(gemm, launch=None):
    """The GEMM loop's own time (events around it on the current stream),
    with `launch` (may be None) enqueuing transfers elsewhere first."""
    gemm()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    if launch is not None:
        launch()
    start.record()
    gemm()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def emit(line):
    print(json.dumps(line), flush=True)


def nccl_half(args):
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device())
    sizes = elements()
    owner = [m % world for m in range(len(sizes))]
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        width = torch.tensor([], dtype=dtype).element_size()
        bufs = [torch.zeros(n, device=device, dtype=dtype) for n in sizes]
        mine = sum(n for m, n in enumerate(sizes) if owner[m] == rank)
        most = max(sum(n for m, n in enumerate(sizes) if owner[m] == r)
                   for r in range(world))
        packed = torch.zeros(most, device=device, dtype=dtype)
        gathered = torch.zeros(most * world, device=device, dtype=dtype)

        def per_matrix():
            for m, b in enumerate(bufs):
                dist.broadcast(b, src=owner[m])

        def all_gather():
            dist.all_gather_into_tensor(gathered, packed)

        received = sum(sizes) - mine
        per_ms = timed(per_matrix)
        ag_ms = timed(all_gather)
        gemm = gemm_loop(device, args.gemm_iters)
        gemm_alone = gemm_ms_beside(gemm)
        side = torch.cuda.Stream(device)

        def on_side(transfer):
            def launch():
                with torch.cuda.stream(side):
                    for _ in range(4):  # outlasts the GEMM loop
                        transfer()
            return launch
        dist.barrier()
        with_per = gemm_ms_beside(gemm, on_side(per_matrix))
        dist.barrier()
        with_ag = gemm_ms_beside(gemm, on_side(all_gather))
        if rank == 0:
            for what, ms, calls, beside in (
                    ("per_matrix", per_ms, len(sizes), with_per),
                    ("all_gather", ag_ms, 1, with_ag)):
                emit({"what": "transfer_updates_2gpu", "path": what,
                      "dtype": name, "ms": ms, "nccl_calls": calls,
                      "bytes_received_per_rank": received * width,
                      "gbps_per_direction": received * width / ms / 1e6,
                      "link_gbps_per_direction": args.link_gbps,
                      "over_per_matrix": ms / per_ms,
                      "gemm_alone_ms": gemm_alone,
                      "gemm_beside_ms": beside,
                      "gemm_slowdown": beside / gemm_alone})
        if dtype == torch.float32:
            # The unreduced layout's gradients going to their owners (fp32,
            # as gradients stay): a reduce per matrix against one
            # reduce-scatter over per-owner segments.
            def per_matrix_reduce():
                for m, b in enumerate(bufs):
                    dist.reduce(b, dst=owner[m])

            def reduce_scatter():
                dist.reduce_scatter_tensor(packed, gathered)
            red_ms = timed(per_matrix_reduce)
            rs_ms = timed(reduce_scatter)
            if rank == 0:
                sent = (sum(sizes) - mine) * width
                for what, ms, calls in (("per_matrix_reduce", red_ms,
                                         len(sizes)),
                                        ("reduce_scatter", rs_ms, 1)):
                    emit({"what": "transfer_grads_2gpu", "path": what,
                          "dtype": name, "ms": ms, "nccl_calls": calls,
                          "bytes_sent_per_rank": sent,
                          "gbps_per_direction": sent / ms / 1e6,
                          "link_gbps_per_direction": args.link_gbps,
                          "over_per_matrix": ms / red_ms})
        del bufs, packed, gathered
        torch.cuda.empty_cache()
    dist.destroy_process_group()


def peer_half(args):
    if torch.cuda.device_count() < 2:
        raise SystemExit("peer needs two GPUs in one process")
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    access = torch.cuda.can_device_access_peer(0, 1)
    sizes = elements()
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        width = torch.tensor([], dtype=dtype).element_size()
        half = [sum(n for m, n in enumerate(sizes) if m % 2 == r)
                for r in range(2)]
        src = [torch.zeros(half[r], device=devices[r], dtype=dtype)
               for r in range(2)]
        dst = [torch.zeros(half[1 - r], device=devices[r], dtype=dtype)
               for r in range(2)]
        streams = [torch.cuda.Stream(d) for d in devices]

        def copies():
            # Rank r's owned updates land on the other GPU, pulled by its
            # stream (both directions at once).
            for r in range(2):
                with torch.cuda.stream(streams[r]):
                    dst[r].copy_(src[1 - r], non_blocking=True)
            for r in range(2):
                torch.cuda.current_stream(devices[0]).wait_stream(streams[r])

        with torch.cuda.device(0):
            ms = timed(copies)
            gemm = gemm_loop(devices[0], args.gemm_iters)
            gemm_alone = gemm_ms_beside(gemm)

            def launch():
                for _ in range(4):  # outlasts the GEMM loop
                    for r in range(2):
                        with torch.cuda.stream(streams[r]):
                            dst[r].copy_(src[1 - r], non_blocking=True)
            with_copies = gemm_ms_beside(gemm, launch)
        received = half[1] * width
        emit({"what": "transfer_updates_2gpu", "path": "peer_copy",
              "dtype": name, "ms": ms, "nccl_calls": 0,
              "peer_access": access,
              "bytes_received_per_rank": received,
              "gbps_per_direction": received / ms / 1e6,
              "link_gbps_per_direction": args.link_gbps,
              "gemm_alone_ms": gemm_alone, "gemm_beside_ms": with_copies,
              "gemm_slowdown": with_copies / gemm_alone})
        del src, dst
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("half", choices=["nccl", "peer"])
    p.add_argument("--link_gbps", type=float, default=450.0,
                   help="the GPUs' link, GB/s per direction (H200 NV18: 450)")
    p.add_argument("--gemm_iters", type=int, default=20)
    args = p.parse_args()
    emit({"what": "transfer_env", "half": args.half,
          "torch": torch.__version__,
          "device": torch.cuda.get_device_name(0),
          "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    (nccl_half if args.half == "nccl" else peer_half)(args)


if __name__ == "__main__":
    main()
