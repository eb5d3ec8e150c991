#!/usr/bin/env python3
"""Summarizes an ncu Speed-of-Light CSV (run_ns_suite.sh's "ncu" phase).

Groups the profiled kernels by kind (cuBLAS/cuBLASLt GEMMs by grid shape,
muonps's own kernels by name) and prints, per group: launches, total time,
share of the profiled time, and the time-weighted mean of ncu's SM and
memory throughput (% of peak). Usage:

  python3 bench/ns_gpu/ncu_summary.py ncu.csv
"""
import collections
import csv
import re
import sys


def read_kernels(path):
    """{launch id: {"name", "grid", metric name: value}} from ncu's CSV."""
    kernels = collections.OrderedDict()
    with open(path, newline="") as f:
        rows = csv.reader(line for line in f if line.startswith('"'))
        header = next(rows)
        col = {name: i for i, name in enumerate(header)}
        for row in rows:
            k = kernels.setdefault(row[col["ID"]], {
                "name": row[col["Kernel Name"]],
                "grid": row[col["Grid Size"]],
            })
            metric = row[col["Metric Name"]]
            if metric:
                value = row[col["Metric Value"]].replace(",", "")
                unit = row[col["Metric Unit"]]
                try:
                    v = float(value)
                except ValueError:
                    continue
                if metric == "Duration":
                    v *= {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3,
                          "nsecond": 1e-6, "ms": 1.0, "msecond": 1.0}.get(
                              unit, 1.0)
                k[metric] = v
    return kernels


def kind_of(kernel):
    """A group name: own kernels by name, GEMMs by library kernel family."""
    name = kernel["name"]
    own = re.search(r"(\w+Kernel)\b", name)
    if own:
        return own.group(1)
    if "ptrBatch" in name or "Batched" in name:
        return "tile GEMM (pointer-array batch) " + name
    return "GEMM " + name


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_summary.py ncu.csv")
    kernels = read_kernels(sys.argv[1])
    groups = collections.OrderedDict()
    for k in kernels.values():
        g = groups.setdefault(kind_of(k), {"n": 0, "ms": 0.0, "sm": 0.0,
                                           "mem": 0.0})
        ms = k.get("Duration", 0.0)
        g["n"] += 1
        g["ms"] += ms
        g["sm"] += ms * k.get("Compute (SM) Throughput", 0.0)
        g["mem"] += ms * k.get("Memory Throughput", 0.0)
    total = sum(g["ms"] for g in groups.values())
    print(f"{len(kernels)} kernels, {total:.1f} ms profiled")
    print(f"{'kind':<58} {'n':>4} {'ms':>8} {'share':>6} {'SM%':>5} "
          f"{'mem%':>5}")
    for kind, g in sorted(groups.items(), key=lambda kv: -kv[1]["ms"]):
        ms = g["ms"] or 1e-12
        print(f"{kind:<58} {g['n']:>4} {g['ms']:>8.2f} "
              f"{100 * g['ms'] / total:>5.1f}% {g['sm'] / ms:>5.0f} "
              f"{g['mem'] / ms:>5.0f}")


if __name__ == "__main__":
    main()
