"""The limits bench/train_step states next to its figures: the GPU's
datasheet peaks, a bf16 GEMM measured in the same run, and the floors they
put under a forward + backward and under each optimizer's step."""

import os
import socket

import torch

# Dense bf16 tensor-core TFLOP/s and HBM TB/s from the vendors' datasheets,
# by a substring of torch.cuda.get_device_name (first match wins).
DATASHEET = [
    ("H200", 989.4, 4.8),
    ("H100 PCIe", 756.0, 2.0),
    ("H100", 989.4, 3.35),
    ("A100", 312.0, 2.0),
]

# Bytes one fused AdamW step moves per fp32 parameter: reads the parameter,
# gradient and both moments, writes the parameter and both moments.
ADAMW_BYTES_PER_PARAM = 28


def machine(device):
    """Where the run was: host, GPU name, torch and CUDA versions, and
    whether the CUDA MPS daemon runs (as run_gpu.sh says, else whether its
    control pipe is there): the trainer and a muonps worker then share the
    GPU through MPS instead of time-slicing."""
    out = {"host": socket.gethostname(), "torch": torch.__version__,
           "device": str(device)}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
        said = os.environ.get("TRAIN_STEP_CUDA_MPS")  # run_gpu.sh's
        if said in ("0", "1"):
            out["cuda_mps"] = said == "1"
        else:
            pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
            out["cuda_mps"] = os.path.exists(os.path.join(pipe, "control"))
    return out


def datasheet(device):
    """{"bf16_dense_tflops", "hbm_tbs", "source"} for the GPU, or {}."""
    if device.type != "cuda":
        return {}
    name = torch.cuda.get_device_name(device)
    for key, tflops, tbs in DATASHEET:
        if key in name:
            return {"bf16_dense_tflops": tflops, "hbm_tbs": tbs,
                    "source": f"datasheet ({key})"}
    return {}


def measure_gemm_tflops(device, n=8192, warmup=3, repeats=10):
    """A bf16 n x n x n product's rate on random data (CUDA events), the
    ceiling the model's matrix products can reach on this GPU."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / repeats
    del a, b
    torch.cuda.empty_cache()
    return 2 * n ** 3 / seconds / 1e12


def ns_flops(shapes, steps=5):
    """FLOPs of `steps` quintic Newton-Schulz iterations on each (rows,
    cols) matrix as torch.optim.Muon runs them: dense products on the wide
    orientation (m <= n), per iteration X X^T (2 m^2 n), A A (2 m^3),
    B X (2 m^2 n)."""
    total = 0
    for rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += steps * (4 * m * m * n + 2 * m ** 3)
    return total


def ns_fewest_flops(shapes, steps=5, gram_restarts=(2,)):
    """The fewer FLOPs of NS5 and Gram NS per matrix, with every product
    whose result is symmetric computed as one triangle, as muonps's
    kernels execute them (newton_schulz/flops.cc's NsExecutedFlops, whose
    branches this mirrors: in m^3 units with alpha = n / m, NS5 15 alpha +
    5 and Gram NS 6 alpha + 14 at 5 steps)."""
    total = 0
    for rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        gram, left, half_cube = m * m * n, 2 * m * m * n, m ** 3
        ns5 = steps * (gram + half_cube + left)
        flops, q_is_identity = gram, True
        for step in range(steps):
            flops += half_cube
            if not q_is_identity:
                flops += half_cube
            q_is_identity = False
            if step + 1 == steps:
                break
            if step + 1 in gram_restarts:
                flops += left + gram
                q_is_identity = True
            else:
                flops += 2 * half_cube
        if not q_is_identity:
            flops += left
        total += min(ns5, flops)
    return total


def floors(cfg, model_flops, split, world, sharded, peaks, gemm_tflops):
    """The least time the hardware allows, per GPU: forward + backward at
    the measured GEMM rate (and at the datasheet peak), and the step: the
    fewest Newton-Schulz FLOPs of the Muon matrices (spread evenly over the
    GPUs) at the measured GEMM rate plus AdamW's bytes at the datasheet HBM
    bandwidth (AdamW's parameters split over the GPUs when `sharded`).
    torch.optim.Muon's dense NS5 at the same rate is given beside it."""
    out = {}
    if gemm_tflops:
        out["fwd_bwd_floor_ms_at_measured_gemm"] = (
            model_flops / (gemm_tflops * 1e12) * 1e3)
    if peaks:
        out["fwd_bwd_floor_ms_at_peak"] = (
            model_flops / (peaks["bf16_dense_tflops"] * 1e12) * 1e3)
    if not (gemm_tflops and peaks):
        return out
    step_ms = 0.0
    if split.get("muon_tensors"):
        shapes = cfg.layer_matrix_shapes() * cfg.layers
        dense = ns_flops(shapes) / world
        fewest = ns_fewest_flops(shapes) / world
        out["ns5_dense_tflop_per_step_per_gpu"] = dense / 1e12
        out["ns_fewest_tflop_per_step_per_gpu"] = fewest / 1e12
        out["ns5_dense_ms_at_measured_gemm"] = (
            dense / (gemm_tflops * 1e12) * 1e3)
        step_ms += fewest / (gemm_tflops * 1e12) * 1e3
    adamw_params = split.get("adamw_params", 0) / (world if sharded else 1)
    step_ms += (ADAMW_BYTES_PER_PARAM * adamw_params /
                (peaks["hbm_tbs"] * 1e12) * 1e3)
    out["step_floor_ms"] = step_ms
    out["step_floor_rule"] = (
        "the fewer of NS5 and Gram NS FLOPs (symmetric products as one "
        "triangle) / measured bf16 GEMM rate + 28 B per AdamW parameter / "
        "datasheet HBM bandwidth")
    return out
