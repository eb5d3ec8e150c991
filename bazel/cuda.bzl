"""cuda_library: compiles .cu files with the machine's nvcc into a static
library that cc rules link, since Bazel 4.2.3 has no CUDA rules of its own.
Targets sm_90 (H100, H200) with PTX for newer GPUs."""

_NVCC = "/usr/local/cuda/bin/nvcc"

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    gencode = ("-gencode arch=compute_90,code=sm_90 " +
               "-gencode arch=compute_90,code=compute_90 ")
    objects = []
    for src in srcs:
        obj = "_" + name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_compile",
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = (_NVCC + " -std=c++17 -O3 -lineinfo -I. " +
                   gencode +
                   "-Xcompiler -fPIC -Xcompiler -Wall -Werror all-warnings " +
                   "-c $(location " + src + ") -o $@"),
        )
        objects.append(obj)
    native.genrule(
        name = name + "_archive",
        srcs = objects,
        outs = ["lib" + name + "_device.a"],
        cmd = "ar rcs $@ $(SRCS)",
    )
    native.cc_library(
        name = name,
        srcs = ["lib" + name + "_device.a"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = True,
        visibility = visibility,
    )
