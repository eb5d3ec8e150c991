"""Where one process of bench/train_step runs: alone (one GPU or the CPU),
or as one rank of a torchrun job (WORLD_SIZE > 1) that wraps the model in
DistributedDataParallel or shards it with FSDP2's fully_shard."""

import datetime
import os

import torch

# NVLink multicast stays off on the GPU machines (their KINDS.md says why);
# set before any process group is made, inherited by every child process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)


class Ranks:
    """This process's rank, world size, device and data-parallel mode.

    With WORLD_SIZE > 1 (torchrun), it joins the process group (NCCL on
    GPUs, gloo on the CPU) with one GPU per local rank; `parallel` is then
    "ddp" or "fsdp". Alone, `parallel` is "none" whatever was asked."""

    def __init__(self, device, parallel, fsdp_bf16_params=False):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.fsdp_bf16_params = fsdp_bf16_params
        self.parallel = parallel if self.world > 1 else "none"
        if self.world > 1 and parallel == "none":
            raise SystemExit("train_step.py: under torchrun (WORLD_SIZE="
                             f"{self.world}) pass --parallel ddp or fsdp")
        cuda = device != "cpu" and torch.cuda.is_available()
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("train_step.py: --device cuda but this torch "
                             "sees no GPU")
        if cuda:
            index = self.local_rank if self.world > 1 else (
                torch.device(device).index or 0)
            self.device = torch.device("cuda", index)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.world > 1:
            import torch.distributed as dist
            init = dict(backend="nccl" if cuda else "gloo",
                        timeout=datetime.timedelta(seconds=600))
            try:
                dist.init_process_group(
                    **init, **(dict(device_id=self.device) if cuda else {}))
            except TypeError:  # a torch without device_id
                dist.init_process_group(**init)

    def wrap(self, model):
        """The model as the loop steps it: DDP's wrapper, or the model
        fully_shard-ed layer by layer then at its root (in place)."""
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(
                model, device_ids=([self.device] if self.device.type == "cuda"
                                   else None))
        if self.parallel == "fsdp":
            try:
                from torch.distributed.fsdp import (MixedPrecisionPolicy,
                                                    fully_shard)
            except ImportError:  # torch 2.4/2.5
                from torch.distributed._composable.fsdp import (
                    MixedPrecisionPolicy, fully_shard)
            kwargs = {}
            if self.fsdp_bf16_params:
                kwargs["mp_policy"] = MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.layers:
                fully_shard(layer, **kwargs)
            fully_shard(model, **kwargs)
        return model

    def max_over_ranks(self, values):
        """Each value's maximum over the ranks (a list of floats)."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist
        t = torch.tensor(list(values), dtype=torch.float64,
                         device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()

    def close(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()
