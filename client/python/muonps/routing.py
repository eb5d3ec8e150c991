"""Which parameters Muon optimizes, and the names muonps knows them by."""

import torch

# Substrings of a lower-cased parameter name that keep a 2-D or 3-D tensor
# on AdamW: embeddings and output heads are lookup tables and classifiers,
# not linear maps between hidden states, and Muon is not meant for them.
ADAMW_NAME_PARTS = ("embed", "lm_head", "output")


def default_is_matrix(name, param):
    """True for 2-D parameters (3-D: a stack of expert matrices) that are not
    embeddings or output heads.

    A parameter stays on AdamW if its lower-cased name contains "embed",
    "lm_head" or "output", or has a module component named "head" (it starts
    with "head." or contains ".head."). Pass `is_matrix(name, param)` to Muon
    to decide differently.
    """
    if param.dim() not in (2, 3):
        return False
    lowered = name.lower()
    if any(part in lowered for part in ADAMW_NAME_PARTS):
        return False
    return not (lowered.startswith("head.") or ".head." in lowered)


def split_named(params, next_index):
    """Tensors and names of one group's `params`.

    `params` holds tensors, or (name, tensor) pairs as named_parameters()
    yields; unnamed tensors are called "param.{i}" with i counting every
    parameter the optimizer has been given. Returns (tensors, names).
    """
    if isinstance(params, torch.Tensor):
        params = [params]
    tensors, names = [], []
    for item in params:
        if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(
                item[0], str):
            name, tensor = item
        else:
            name, tensor = f"param.{next_index + len(tensors)}", item
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"muonps.Muon: parameter {name!r} is a "
                            f"{type(tensor).__name__}, not a torch.Tensor")
        tensors.append(tensor)
        names.append(name)
    return tensors, names
