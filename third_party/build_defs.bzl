"""Build macros: CUDA sources through nvcc, and protobuf/gRPC code generation.

Both run the system tools (nvcc, protoc, grpc_cpp_plugin) in genrules, which
is all Bazel 4.2.3 can do offline without rules_cuda or rules_proto.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH")

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX so a
# newer GPU can JIT it.
_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-Xcompiler -fPIC",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=[sm_90,compute_90]",
    "--expt-relaxed-constexpr",
])

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    """A cc_library whose .cu sources are compiled by nvcc.

    Every header a .cu file includes must be in `hdrs` (or in `srcs` as a
    .cuh): nvcc runs in a sandbox that holds nothing else, which keeps the
    CUDA translation units free of abseil, gRPC and the rest. Under
    --config=cpu_only the objects are left out and only the headers remain,
    so callers must guard their calls with PS_WITH_CUDA (//:cuda_defines).
    Without a CUDA toolkit on the machine the nvcc rules are not even
    declared, so `bazel build //...` has nothing it cannot build.
    """
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    cuh = [s for s in srcs if not s.endswith(".cu")]
    objs = []
    for src in (cu_srcs if CUDA_FOUND else []):
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj.replace(".o", "_nvcc"),
            srcs = [src] + hdrs + cuh,
            outs = [obj],
            # nvcc finds its headers relative to its real path, so it runs
            # from the toolkit rather than through a symlink.
            cmd = "%s/bin/nvcc %s -I. -c $(location %s) -o $@" % (CUDA_PATH, _NVCC_FLAGS, src),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = select({
            "//:cuda_enabled": objs,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//:cuda_enabled": ["@local_cuda//:cudart"],
            "//conditions:default": [],
        }),
        visibility = visibility,
    )

def proto_cc_library(name, src, grpc = False, deps = [], visibility = None):
    """C++ message (and, with grpc = True, service) code for one .proto file."""
    base = src[:-len(".proto")]
    pkg = native.package_name()
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    plugin = ""
    if grpc:
        plugin = ("--plugin=protoc-gen-grpc=$(location @system//:grpc_cpp_plugin) " +
                  "--grpc_out=$(GENDIR) ")
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        tools = ["@system//:protoc", "@system//:grpc_cpp_plugin"],
        cmd = ("$(location @system//:protoc) -I. --cpp_out=$(GENDIR) " + plugin +
               "%s/%s" % (pkg, src)),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
    )
