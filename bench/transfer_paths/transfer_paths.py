"""Ways to move the step's updates between the GPUs of one host, measured.

The replicated layout sends every owner's updates to every other GPU. This
bench times that phase for the 56 matrices of 8 Llama-3-8B layers (1.74 B
parameters) on N GPUs of one host, matrix m owned by GPU m % N, three ways
and in two precisions (fp32, bf16: the precision Newton-Schulz produces
them in):

  per_matrix   one NCCL broadcast per matrix from its owner (the data path
               of today, step_transfers.cc)
  all_gather   one NCCL all_gather of each rank's owned updates, laid out
               contiguously
  peer_copy    copy-engine peer copies (cudaMemcpyPeerAsync through
               torch's device-to-device copy), every GPU pulling from every
               other at once, no kernel and no SM

and what each costs a bf16 GEMM running at the same time on the same GPU
(Newton-Schulz is GEMMs): the GEMM loop's time alone and beside each. For
the unreduced layout, the fp32 gradients going to their owners: a reduce
per matrix against one reduce-scatter. For the row_sharded layout, the
updates going back as row blocks (each owner sends each rank its 1/N of
the rows of every matrix it owns): one all-to-all against a grouped
send/recv per matrix.

Run the NCCL half under torchrun on N GPUs, the peer half in one process:
  torchrun --standalone --nproc-per-node N transfer_paths.py nccl
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
                emit({"what": "transfer_updates", "gpus": world,
                      "path": what, "dtype": name, "ms": ms, "nccl_calls": calls,
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
                    emit({"what": "transfer_grads", "gpus": world,
                          "path": what, "dtype": name, "ms": ms, "nccl_calls": calls,
                          "bytes_sent_per_rank": sent,
                          "gbps_per_direction": sent / ms / 1e6,
                          "link_gbps_per_direction": args.link_gbps,
                          "over_per_matrix": ms / red_ms})
        # row_sharded: the owner of matrix m sends rank r rows
        # [r*R/N, (r+1)*R/N) of its update. Per matrix: the owner's
        # sends and every rank's receive in one NCCL group; or all of
        # them as one all-to-all over per-rank segments.
        blocks = [b.view(SHAPES[m][0], -1).chunk(world)
                  for m, b in enumerate(bufs)]

        def per_matrix_rows():
            for m in range(len(bufs)):
                ops = []
                if owner[m] == rank:
                    for r in range(world):
                        if r != rank:
                            ops.append(dist.P2POp(
                                dist.isend, blocks[m][r].contiguous(), r))
                else:
                    ops.append(dist.P2POp(dist.irecv, blocks[m][rank],
                                          owner[m]))
                for w in dist.batch_isend_irecv(ops):
                    w.wait()

        in_rows = mine // world
        send_buf = torch.zeros(in_rows * world, device=device,
                               dtype=dtype)
        in_split = [in_rows] * world
        out_split = [sum(n for m, n in enumerate(sizes)
                         if owner[m] == r) // world for r in range(world)]
        recv_buf = torch.zeros(sum(out_split), device=device,
                               dtype=dtype)

        def all_to_all():
            dist.all_to_all_single(recv_buf, send_buf, out_split,
                                   in_split)
        rows_ms = timed(per_matrix_rows)
        a2a_ms = timed(all_to_all)
        dist.barrier()
        with_a2a = gemm_ms_beside(gemm, on_side(all_to_all))
        if rank == 0:
            got = (sum(out_split) - out_split[rank]) * width
            for what, ms, calls, beside in (
                    ("per_matrix_rows", rows_ms, len(sizes), None),
                    ("all_to_all", a2a_ms, 1, with_a2a)):
                line = {"what": "transfer_row_updates", "gpus": world,
                        "path": what, "dtype": name, "ms": ms,
                        "nccl_calls": calls,
                        "bytes_received_per_rank": got,
                        "gbps_per_direction": got / ms / 1e6,
                        "link_gbps_per_direction": args.link_gbps,
                        "over_per_matrix": ms / rows_ms}
                if beside is not None:
                    line.update(gemm_alone_ms=gemm_alone,
                                gemm_beside_ms=beside,
                                gemm_slowdown=beside / gemm_alone)
                emit(line)
        del blocks, send_buf, recv_buf
        del bufs, packed, gathered
        torch.cuda.empty_cache()
    dist.destroy_process_group()


def peer_half(args):
    world = torch.cuda.device_count()
    if world < 2:
        raise SystemExit("peer needs two GPUs in one process")
    devices = [torch.device("cuda", r) for r in range(world)]
    access = all(torch.cuda.can_device_access_peer(r, q)
                 for r in range(world) for q in range(world) if r != q)
    sizes = elements()
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        width = torch.tensor([], dtype=dtype).element_size()
        owned = [sum(n for m, n in enumerate(sizes) if m % world == r)
                 for r in range(world)]
        src = [torch.zeros(owned[r], device=devices[r], dtype=dtype)
               for r in range(world)]
        # dst[r][q]: GPU q's owned updates, landed on GPU r.
        dst = [{q: torch.zeros(owned[q], device=devices[r], dtype=dtype)
                for q in range(world) if q != r} for r in range(world)]
        streams = [torch.cuda.Stream(d) for d in devices]

        def launch_copies():
            # Every GPU's stream pulls every other GPU's owned updates.
            for r in range(world):
                with torch.cuda.stream(streams[r]):
                    for q, buf in dst[r].items():
                        buf.copy_(src[q], non_blocking=True)

        def copies():
            launch_copies()
            for r in range(world):
                torch.cuda.current_stream(devices[0]).wait_stream(streams[r])

        with torch.cuda.device(0):
            ms = timed(copies)
            gemm = gemm_loop(devices[0], args.gemm_iters)
            gemm_alone = gemm_ms_beside(gemm)

            def launch():
                for _ in range(4):  # outlasts the GEMM loop
                    launch_copies()
            with_copies = gemm_ms_beside(gemm, launch)
        received = (sum(owned) - owned[0]) * width
        emit({"what": "transfer_updates", "gpus": world, "path": "peer_copy",
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
