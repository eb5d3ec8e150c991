"""Which parameters Muon optimizes, and the names muonps knows them by.

Muon is for the 2-D weights of hidden layers (torch.optim.Muon's
documentation: embeddings, the output head, norms, biases and scalars
belong with AdamW). Given the model, muonps decides from what each
parameter is, not from its name:

- the weight of every nn.Embedding (or nn.EmbeddingBag), and any parameter
  tied to one (the same tensor, or the same storage: a tied LM head), get
  AdamW;
- the output head gets AdamW: one nn.Linear, the one tied to an embedding,
  else the last whose out_features is an embedding's vocabulary size, else
  (a model with no embedding) the model's last nn.Linear (the final layer
  of an nn.Sequential);
- every other 2-D parameter is a matrix for Muon, and a 3-D one a stack of
  expert matrices;
- everything else (norms, biases, scalars) gets AdamW.

The model comes from `muonps.Muon(model, ...)`, `model=`, or the generator
`model.named_parameters()` itself. Given only tensors or (name, tensor)
pairs, `default_is_matrix` decides by shape and name. An explicit
`is_matrix(name, param)`, or a param group's "use_muon" (True or False),
overrides either.
"""

import logging

import torch

LOG = logging.getLogger("muonps")

# Substrings of a lower-cased parameter name that keep a 2-D or 3-D tensor
# on AdamW when no model says what it is: embeddings and output heads are
# lookup tables and classifiers, not linear maps between hidden states.
ADAMW_NAME_PARTS = ("embed", "lm_head", "output", "wte", "wpe")

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def default_is_matrix(name, param):
    """True for 2-D parameters (3-D: a stack of expert matrices) whose
    names do not say they are embeddings or output heads: the routing when
    no model is known.

    A parameter stays on AdamW if its lower-cased name contains "embed",
    "lm_head", "output", "wte" or "wpe", or has a module component named
    "head" (it starts with "head." or contains ".head."). Pass the model
    (`muonps.Muon(model)`) to route by module type instead, or
    `is_matrix(name, param)` to decide differently.
    """
    if param.dim() not in (2, 3):
        return False
    lowered = name.lower()
    if any(part in lowered for part in ADAMW_NAME_PARTS):
        return False
    return not (lowered.startswith("head.") or ".head." in lowered)


def resolve_model(params, model=None):
    """(params, model): `params` as the optimizer takes them, and the
    nn.Module they come from, if known: `params` itself when it is a
    module (its named_parameters() are taken), `model`, or the module whose
    named_parameters() generator `params` is (None otherwise)."""
    if isinstance(params, torch.nn.Module):
        if model is not None and model is not params:
            raise ValueError("muonps.Muon: params is a module and model= "
                             "names another one")
        return params.named_parameters(), params
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"muonps.Muon: model= is a "
                            f"{type(model).__name__}, not a torch.nn.Module")
        return params, model
    frame = getattr(params, "gi_frame", None)
    code = getattr(params, "gi_code", None)
    if frame is not None and code is not None and (
            code.co_name == "named_parameters"):
        owner = frame.f_locals.get("self")
        prefix = frame.f_locals.get("prefix", "")
        if isinstance(owner, torch.nn.Module) and not prefix:
            return params, owner
    return params, None


def _storage(tensor):
    """A key of the memory under `tensor` (None for one with no memory)."""
    if getattr(tensor, "is_meta", False):
        return None
    if hasattr(tensor, "to_local"):  # a DTensor: its shard's memory
        tensor = tensor.to_local()
    try:
        storage = (tensor.untyped_storage() if hasattr(tensor, "untyped_storage")
                   else tensor.storage())
        pointer = storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (tensor.device, pointer) if pointer else None


def _linear_weights(module):
    """(name, nn.Linear) of `module`, in registration order."""
    return [(n, m) for n, m in module.named_modules()
            if isinstance(m, torch.nn.Linear)]


def model_roles(model):
    """{id(parameter): (role, module name)} of the parameters of `model`
    that go to AdamW for what they are: "embedding", "tied to NAME" or
    "output head". The other parameters are routed by shape."""
    roles = {}
    embeddings = [(n, m) for n, m in model.named_modules()
                  if isinstance(m, _EMBEDDINGS)]
    storages = {}
    vocabularies = set()
    for name, module in embeddings:
        roles[id(module.weight)] = ("embedding", name)
        key = _storage(module.weight)
        if key is not None:
            storages.setdefault(key, name)
        vocabularies.add(module.num_embeddings)
    linears = _linear_weights(model)
    tied = False
    for name, module in linears:  # a head that is an embedding's weight
        role = roles.get(id(module.weight))
        if role is not None and role[0].startswith("embedding"):
            roles[id(module.weight)] = (f"{role[0]}, tied to {name}.weight",
                                        role[1])
            tied = True
    # One output head: the tied one, else the last Linear onto a
    # vocabulary, else (no embedding) the model's last Linear.
    if tied:
        heads = []
    elif embeddings:
        heads = [(n, m) for n, m in linears
                 if m.out_features in vocabularies][-1:]
    else:
        heads = linears[-1:]
    for name, module in heads:
        if id(module.weight) not in roles:
            roles[id(module.weight)] = ("output head", name)
    try:  # tied copies too (torch >= 2.0 can list them)
        named = list(model.named_parameters(remove_duplicate=False))
    except TypeError:
        named = list(model.named_parameters())
    for name, p in named:
        if id(p) in roles:
            continue
        key = _storage(p)
        if key is not None and key in storages:
            roles[id(p)] = (f"tied to {storages[key]}", name)
    return roles


class Router:
    """Decides, per parameter, Muon or AdamW (see the module docstring),
    and keeps what it decided for describe()."""

    def __init__(self, model=None, is_matrix=None):
        self.model = model
        self.is_matrix = is_matrix
        self._roles = model_roles(model) if model is not None else {}
        self.decisions = []  # (name, param, muon, why)

    @property
    def rule(self):
        if self.is_matrix is not None:
            return "is_matrix"
        if self.model is not None:
            return f"the model ({type(self.model).__name__})"
        return "shapes and names (no model given)"

    def decide(self, name, param, group):
        """True when `param` (called `name`, of param group `group`) is a
        matrix for Muon."""
        if group.get("use_muon") is not None:
            muon = bool(group["use_muon"])
            why = "its group's use_muon"
        elif self.is_matrix is not None:
            muon = bool(self.is_matrix(name, param))
            why = "is_matrix"
        elif id(param) in self._roles:
            muon, why = False, self._roles[id(param)][0]
        elif self.model is not None:
            muon = param.dim() in (2, 3)
            why = ("hidden matrix" if param.dim() == 2 else "expert stack"
                   if muon else "norm, bias or scalar")
        else:
            muon = default_is_matrix(name, param)
            why = ("matrix" if muon else "by its name" if param.dim() in (
                2, 3) else "norm, bias or scalar")
        self.decisions.append((name, param, muon, why))
        return muon

    def describe(self):
        """One line: how many tensors and parameters go where, naming the
        embeddings, heads and tied weights (and what an override moved)."""
        def count(muon):
            chosen = [p for _, p, m, _ in self.decisions if m == muon]
            return len(chosen), sum(p.numel() for p in chosen)
        muon_tensors, muon_elements = count(True)
        adamw_tensors, adamw_elements = count(False)
        notable = [f"{name} ({why})" for name, _, muon, why in self.decisions
                   if not muon and why not in ("norm, bias or scalar",)]
        overridden = [name for name, p, muon, why in self.decisions
                      if muon and id(p) in self._roles]
        line = (f"muonps routing by {self.rule}: Muon {muon_tensors} tensors "
                f"({muon_elements:,} parameters); AdamW {adamw_tensors} "
                f"tensors ({adamw_elements:,} parameters)")
        if notable:
            line += "; on AdamW: " + ", ".join(notable)
        if overridden:
            line += "; on Muon by override: " + ", ".join(overridden)
        return line


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
