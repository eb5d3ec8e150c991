#!/usr/bin/env python3
"""CPU emulation of the 16-bit roundings of kernels/cuda/ns_iteration.cc.

Every GEMM input is rounded to bf16 (8 mantissa bits) or fp16 (11; no range
limits, as the fp16 storage scales keep values normal), products accumulate
in fp32, the `a` terms stay in fp32, as on the GPU. Prints, per precision,
the largest error of NS5 and of Gram NS (several restart schedules, D = Q -
c I applied in the first segment and in later segments of at most 2 steps)
against the fp64 NS5 on rank-deficient inputs (ns_accuracy_gpu_test's
shapes, ranks k/2 and 1, singular values 1..1e-6) and on Gaussian inputs, in
units of the precision's unit roundoff u. This is what chose the accurate
schedule {1, 3, 4}; the GPU measured within 1.4x of these figures.

It also runs a restart that was ruled out: R <- Q R0 Q from the first R0
in fp32 (its bf16 hi + lo halves, and the product's too) instead of
X <- Q X, R <- X X^T, with X multiplied once by the accumulated Q at the
end. It would save 1.5 alpha - 3.5 m^3 multiply-adds per restart (tall
Llama shapes: about 10% of their FLOPs), but on rank-deficient inputs it
is 8-22 times less accurate than the X restart with one restart, and
thousands of times with three: R no longer sees X's rounding in the
directions X does not span.

Needs numpy (Debian's python3-numpy): /usr/bin/python3 gram_rounding_emulation.py
"""

import numpy as np

A, B, C = 3.4445, -4.7750, 2.0315


def rnd(x, bits):
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    sh = 24 - bits
    u = ((u + (1 << (sh - 1)) - 1 + ((u >> sh) & 1)) >> sh) << sh
    return u.astype(np.uint32).view(np.float32)


def mm(a, b):
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)


def ns5_fp64(x):
    x = x / np.linalg.norm(x)
    for _ in range(5):
        a = x @ x.T
        x = A * x + (B * a + C * a @ a) @ x
    return x


def ns5(x, bits):
    r = lambda v: rnd(v, bits)
    x32 = (x / np.linalg.norm(x)).astype(np.float32)
    xl = r(x32)
    for _ in range(5):
        a = mm(xl, xl.T)
        al = r(a)
        b = B * a + C * mm(al, al)
        x32 = (A * x32 + mm(r(b), xl)).astype(np.float32)
        xl = r(x32)
    return x32


def q_step(r32, rl, seg, r):
    """One step on Q from R: M = b R + c R^2, Q <- (a I + M) Q, with Q kept
    as D = Q - c I in fp32, its 16-bit copy of Q, and c; `seg` is None where
    Q = I. Returns M's 16-bit copy and the new (d32, ql, const)."""
    eye = np.eye(r32.shape[0], dtype=np.float32)
    mt = (B * r32 + C * mm(rl, rl)).astype(np.float32)
    ml = r(mt)
    if seg is None:
        return ml, (mt.copy(), r(mt + A * eye), A)
    d32, ql, const = seg
    d32 = (mm(ml, ql) + A * d32).astype(np.float32)
    const *= A
    return ml, (d32, r(d32 + const * eye), const)


def r_step(ml, r32, rl, r):
    """R <- P (P R), each product a M + the a-term in fp32."""
    r32 = (mm(ml, rl) + A * r32).astype(np.float32)
    r32 = (mm(ml, r(r32)) + A * r32).astype(np.float32)
    return r32, r(r32)


def gram(x, bits, restarts):
    m = x.shape[0]
    r = lambda v: rnd(v, bits)
    x32 = (x / np.linalg.norm(x)).astype(np.float32)
    xl = r(x32)
    r32 = mm(xl, xl.T)
    rl = r(r32)
    first, start, seg = True, 0, None
    ends = sorted(s for s in restarts if 0 < s < 5) + [5]

    def apply(use_d):
        d32, ql, const = seg
        if use_d:
            return (mm(r(d32), xl) + np.float32(const) * x32).astype(np.float32)
        return mm(ql, xl)

    def split():
        end = min(e for e in ends if e > start)
        return m >= 64 and (first or end - start <= 2)

    for step in range(5):
        ml, seg = q_step(r32, rl, seg, r)
        if step == 4:
            break
        if step + 1 not in restarts:
            r32, rl = r_step(ml, r32, rl, r)
            continue
        x32 = apply(split())
        xl = r(x32)
        r32 = mm(xl, xl.T)
        rl = r(r32)
        seg, first, start = None, False, step + 1
    return apply(split())


def gram_congruence(x, bits, restarts):
    m = x.shape[0]
    r = lambda v: rnd(v, bits)
    eye = np.eye(m, dtype=np.float32)
    x32 = (x / np.linalg.norm(x)).astype(np.float32)
    xl = r(x32)
    r0 = mm(xl, xl.T)
    r0_hi = r(r0)
    r0_lo = r(r0 - r0_hi)
    r32, rl, q_total, seg = r0.copy(), r0_hi, None, None
    for step in range(5):
        ml, seg = q_step(r32, rl, seg, r)
        if step < 4 and step + 1 not in restarts:
            r32, rl = r_step(ml, r32, rl, r)
            continue
        d32, ql, const = seg
        segment = (d32 + np.float32(const) * eye).astype(np.float32)
        q_total = segment if q_total is None else mm(ql, r(q_total))
        if step == 4:
            break
        qt = r(q_total)
        t = mm(qt, r0_hi) + mm(qt, r0_lo)
        t_hi = r(t)
        r32 = mm(t_hi, qt) + mm(r(t - t_hi), qt)
        r32 = (np.tril(r32) + np.tril(r32, -1).T).astype(np.float32)
        rl, seg = r(r32), None
    return mm(r(q_total), xl)


def spectrum(m, n, rank, seed):
    g = np.random.default_rng(seed)
    u, _ = np.linalg.qr(g.standard_normal((m, rank)))
    v, _ = np.linalg.qr(g.standard_normal((n, rank)))
    s = np.geomspace(1, 1e-6, rank) if rank > 1 else np.array([1.0])
    return (u * s) @ v.T


def err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main():
    deficient, seed = [], 700
    # ns_accuracy_gpu_test's shapes in their wide orientation (256 x 64 is
    # 64 x 256).
    for m, n in [(64, 256), (64, 256), (128, 512), (96, 96), (256, 1024)]:
        for rank in [m // 2, 1]:
            x = spectrum(m, n, rank, seed)
            seed += 1
            deficient.append((x, ns5_fp64(x)))
    g = np.random.default_rng(5)
    gaussian = [(x, ns5_fp64(x)) for x in
                (g.standard_normal(s) for s in [(64, 256), (128, 128)])]
    for bits, name in [(8, "bf16"), (11, "fp16")]:
        u = 2.0 ** -bits
        worst = lambda f, cases: max(err(f(x), ref) for x, ref in cases) / u
        n5 = worst(lambda x: ns5(x, bits), deficient)
        print(f"{name}: ns5 rank-deficient {n5:.2f} u, gaussian "
              f"{worst(lambda x: ns5(x, bits), gaussian):.2f} u")
        for rs in [(2,), (2, 3), (2, 3, 4), (1, 3, 4)]:
            e = worst(lambda x: gram(x, bits, rs), deficient)
            gs = worst(lambda x: gram(x, bits, rs), gaussian)
            print(f"{name}: gram restarts {rs}: rank-deficient {e:.2f} u "
                  f"({e / n5:.2f}x ns5), gaussian {gs:.2f} u")
        for rs in [(2,), (1, 3, 4)]:
            e = worst(lambda x: gram_congruence(x, bits, rs), deficient)
            gs = worst(lambda x: gram_congruence(x, bits, rs), gaussian)
            print(f"{name}: congruence restarts {rs} (ruled out): "
                  f"rank-deficient {e:.2f} u ({e / n5:.2f}x ns5), "
                  f"gaussian {gs:.2f} u")


if __name__ == "__main__":
    main()
