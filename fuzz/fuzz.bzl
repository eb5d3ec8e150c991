"""muonps_fuzzer: a libFuzzer target and the gcc test that replays its corpus."""

def muonps_fuzzer(name, srcs, deps):
    """Declares `name` (the libFuzzer binary, clang only, tagged manual),
    `name_body` (its LLVMFuzzerTestOneInput as a library) and
    `name_corpus_test` (runs the body over fuzz/corpus/<name>/ with any
    compiler).
    """
    native.cc_library(
        name = name + "_body",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        testonly = True,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name + "_body"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["corpus_replay_main.cc"],
        args = ["fuzz/corpus/" + name],
        data = native.glob(["corpus/%s/*" % name]),
        deps = [":" + name + "_body"],
    )
