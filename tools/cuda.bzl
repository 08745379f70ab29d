"""cuda_library: CUDA sources compiled by the toolkit's nvcc, or stubs.

With a CUDA toolkit (@cuda//:defs.bzl CUDA_AVAILABLE, see
tools/system_libs.bzl), each .cu file becomes one genrule running nvcc for
sm_80 and sm_90 (plus compute_90 PTX), and the objects, the .cc sources and
`hdrs` form a cc_library linked against @cuda//:cuda. Every header of the
calling package is an input of each nvcc run, so .cu files may include any
header of their own package; headers of other packages that they include
(directly or through their package's headers) must be listed in
`nvcc_hdrs`, since nvcc runs in a sandbox holding only its declared inputs;
system headers come from /usr/include (Abseil) or the toolkit.

Without a toolkit the same target is a cc_library of `stub_srcs` (functions
that return absl::UnimplementedError("... built without CUDA")) with
TRAINYARD_NO_CUDA defined, so dependents build and link unchanged.
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_ROOT")

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
    "-I.",
    "-I$(GENDIR)",
    "-I/usr/include",
]

def cuda_library(
        name,
        srcs = [],
        hdrs = [],
        deps = [],
        copts = [],
        nvcc_copts = [],
        nvcc_hdrs = [],
        stub_srcs = [],
        **kwargs):
    """A cc_library whose .cu sources go through nvcc (see the file comment).

    Args:
      name: target name.
      srcs: .cu (nvcc) and .cc (host compiler, with the CUDA headers) files.
      hdrs: public headers; must not include CUDA headers, so that the stub
        build compiles them too.
      deps: cc_library dependencies.
      copts: host-compiler options for the .cc sources.
      nvcc_copts: extra nvcc options for the .cu sources.
      nvcc_hdrs: header labels of other packages that the .cu sources
        include, e.g. "//core:tensor.h" (inputs of the nvcc runs).
      stub_srcs: sources used instead of `srcs` when CUDA is not available.
      **kwargs: passed to cc_library (visibility, testonly, ...).
    """
    if not CUDA_AVAILABLE:
        native.cc_library(
            name = name,
            srcs = stub_srcs,
            hdrs = hdrs,
            deps = deps,
            copts = copts,
            defines = ["TRAINYARD_NO_CUDA"],
            **kwargs
        )
        return
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    cc_srcs = [s for s in srcs if not s.endswith(".cu")]
    package_hdrs = native.glob(["*.h", "*.cuh"])
    objects = []
    for src in cu_srcs:
        obj = "_objs_cuda/%s/%s.o" % (name, src[:-len(".cu")])
        native.genrule(
            name = "%s_%s_nvcc" % (name, src[:-len(".cu")].replace("/", "_")),
            srcs = [src] + package_hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = " ".join(
                [CUDA_ROOT + "/bin/nvcc"] + _NVCC_FLAGS + nvcc_copts +
                ["-c", "$(location %s)" % src, "-o", "$@"],
            ),
            message = "nvcc " + src,
            tags = ["no-remote"],
            visibility = ["//visibility:private"],
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = cc_srcs + objects,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cuda"],
        copts = copts,
        alwayslink = True,
        **kwargs
    )
