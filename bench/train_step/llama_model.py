"""A decoder-only transformer with Llama-3-8B's layer shapes, for timing
whole training iterations (bench/train_step/train_step.py).

Every size is a field of `LlamaConfig`, so the same code builds the
Llama-3-8B-shaped layers on a GPU (d_model 4096, 32 query heads, 8 key/value
heads, SwiGLU hidden 14336) and a toy on the CPU. A layer is RMSNorm,
grouped-query attention (optionally with rotary position embeddings),
RMSNorm, SwiGLU MLP, each with a residual; the model is a token embedding,
N layers, a final RMSNorm and an untied output head. Every linear map is its
own bias-free nn.Linear (q, k, v, o, gate, up, down), so an optimizer sees
the seven matrices per layer that bench/step_gpu's Llama set has.

Attention goes through torch.nn.functional.scaled_dot_product_attention
(causal), or a plain softmax attention where the installed torch lacks it
(Debian's torch 1.13). Key/value heads are repeated to the query heads
before the product by default, which every SDPA backend takes; `gqa="native"`
passes enable_gqa=True instead (torch >= 2.5).
"""

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class LlamaConfig:
    layers: int = 8
    d_model: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn_hidden: int = 14336
    vocab: int = 32768
    seq: int = 4096
    rope: bool = True
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    gqa: str = "repeat"  # "repeat" or "native" (SDPA's enable_gqa)

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of "
                             f"heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of "
                             f"kv_heads {self.kv_heads}")
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, "
                             f"not {self.head_dim}")
        if self.gqa not in ("repeat", "native"):
            raise ValueError(f"gqa: {self.gqa!r} is not 'repeat' or 'native'")

    @property
    def head_dim(self):
        return self.d_model // self.heads

    @property
    def kv_dim(self):
        return self.kv_heads * self.head_dim

    def layer_matrix_shapes(self):
        """(out, in) of one layer's matrices: q, k, v, o, gate, up, down."""
        d, kv, f = self.d_model, self.kv_dim, self.ffn_hidden
        return [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]

    def counts(self):
        """Parameter counts: the layers' matrices, the embedding, the head,
        the norms, and their total."""
        matrices = self.layers * sum(r * c for r, c in
                                     self.layer_matrix_shapes())
        embedding = self.vocab * self.d_model
        head = self.vocab * self.d_model
        norms = (2 * self.layers + 1) * self.d_model
        return {"matrix_params": matrices, "embedding_params": embedding,
                "head_params": head, "norm_params": norms,
                "total_params": matrices + embedding + head + norms}

    def flops_per_iteration(self, tokens):
        """Model FLOPs of one forward + backward over `tokens` tokens
        (sequences of `seq`): 6 per token and matrix (or head) weight, and
        causal attention's two products, QK^T and PV, over the keys each
        query sees ((seq + 1) / 2 on average), 3x for the backward. Flash
        attention's recomputation and elementwise work are not counted
        (the usual model-FLOPs convention)."""
        c = self.counts()
        matmul = 6 * tokens * (c["matrix_params"] + c["head_params"])
        keys_seen = (self.seq + 1) / 2
        attention = 3 * 4 * tokens * keys_seen * self.d_model * self.layers
        return {"matmul_flops": matmul, "attention_flops": attention,
                "model_flops": matmul + attention}


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps, device=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).type_as(x) * self.weight


def rotary_tables(seq, head_dim, theta, device):
    """cos and sin of each position's angles, (seq, head_dim / 2), fp32."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device,
                                           dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device,
                                      dtype=torch.float32), inverse)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """x: (batch, seq, heads, head_dim); rotates the two halves of each
    head as a complex number by its position's angles."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    cos = cos[None, :x.shape[1], None, :].to(x.dtype)
    sin = sin[None, :x.shape[1], None, :].to(x.dtype)
    return torch.cat((first * cos - second * sin,
                      second * cos + first * sin), dim=-1)


def plain_causal_attention(q, k, v):
    """Softmax attention with a causal mask; q, k, v (batch, heads, seq,
    head_dim) with as many key/value heads as query heads."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).type_as(q), v)


class Attention(torch.nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        self.cfg = cfg
        d, kv = cfg.d_model, cfg.kv_dim
        self.q = torch.nn.Linear(d, d, bias=False, device=device)
        self.k = torch.nn.Linear(d, kv, bias=False, device=device)
        self.v = torch.nn.Linear(d, kv, bias=False, device=device)
        self.o = torch.nn.Linear(d, d, bias=False, device=device)

    def forward(self, x, rotary):
        cfg = self.cfg
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, cfg.heads, cfg.head_dim)
        k = self.k(x).view(batch, seq, cfg.kv_heads, cfg.head_dim)
        v = self.v(x).view(batch, seq, cfg.kv_heads, cfg.head_dim)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        groups = cfg.heads // cfg.kv_heads
        if has_sdpa() and cfg.gqa == "native" and groups > 1:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=True)
        else:
            if groups > 1:  # each key/value head serves `groups` queries
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
            if has_sdpa():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = plain_causal_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(batch, seq, cfg.d_model))


class SwiGLU(torch.nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        d, f = cfg.d_model, cfg.ffn_hidden
        self.gate = torch.nn.Linear(d, f, bias=False, device=device)
        self.up = torch.nn.Linear(d, f, bias=False, device=device)
        self.down = torch.nn.Linear(f, d, bias=False, device=device)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(torch.nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps, device)
        self.attention = Attention(cfg, device)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, device)
        self.mlp = SwiGLU(cfg, device)

    def forward(self, x, rotary):
        x = x + self.attention(self.attention_norm(x), rotary)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(torch.nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, cfg, device=None):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.d_model, device=device)
        self.layers = torch.nn.ModuleList(Layer(cfg, device)
                                          for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, device)
        self.head = torch.nn.Linear(cfg.d_model, cfg.vocab, bias=False,
                                    device=device)
        if cfg.rope:
            cos, sin = rotary_tables(cfg.seq, cfg.head_dim, cfg.rope_theta,
                                     device)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """Normal(0, 0.02) weights; the projections back into the residual
        stream (o, down) scaled by 1/sqrt(2 * layers)."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith(("attention.o.weight", "mlp.down.weight")):
                p.normal_(0.0, residual_std)
            else:
                p.normal_(0.0, 0.02)

    def forward(self, tokens):
        rotary = ((self.rope_cos, self.rope_sin) if self.cfg.rope else None)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, rotary)
        return self.head(self.norm(x))


def is_hidden_matrix(name, param):
    """The parameters torch.optim.Muon's documentation gives Muon: the 2-D
    weights of the hidden layers (not the embedding, head or norms)."""
    return param.dim() == 2 and (name.startswith("layers.") or
                                 ".layers." in name)


def corpus_batches(cfg, tokens, data, device, seed=0):
    """Endless batches of windows of `data` (a 1-D tensor of token ids
    below cfg.vocab: a byte corpus), each (inputs, targets) of shape
    (tokens / seq, seq), the windows' starts drawn from `seed`: the same
    sequence for every optimizer of a seed."""
    if tokens % cfg.seq:
        raise ValueError(f"tokens per GPU {tokens} is not a multiple of the "
                         f"sequence length {cfg.seq}")
    batch = tokens // cfg.seq
    g = torch.Generator(device="cpu").manual_seed(1000 + seed)
    while True:
        start = torch.randint(0, len(data) - cfg.seq - 1, (batch,),
                              generator=g)
        rows = torch.stack([data[s:s + cfg.seq + 1] for s in start.tolist()])
        rows = rows.to(device=device, dtype=torch.long)
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def random_batches(cfg, tokens, count, device, seed=0):
    """`count` batches of random token ids, each (inputs, targets) of shape
    (tokens / seq, seq): the micro-batch is tokens per GPU over the
    sequence length."""
    if tokens % cfg.seq:
        raise ValueError(f"tokens per GPU {tokens} is not a multiple of the "
                         f"sequence length {cfg.seq}")
    batch = tokens // cfg.seq
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(count):
        rows = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=g)
        rows = rows.to(device)
        out.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
    return out
