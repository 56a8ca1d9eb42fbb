"""Repository rules that expose Debian's system libraries and the CUDA toolkit.

Nothing is downloaded: `system_libs` and `system_test_libs` ask pkg-config
for each library's flags when the repository is fetched and write a BUILD
file of cc_library targets; `local_cuda` links the toolkit's headers and
libraries into a repository and records whether it was found, so the same
WORKSPACE loads on machines with and without CUDA.

Two repositories, because the packages come in two sets (deploy/setup.sh):
@system holds what the daemons link (`deploy/setup.sh main`), @system_test
what only tests and benchmarks link (GoogleTest, Google Benchmark:
`deploy/setup.sh test`). Bazel fetches a repository only when a requested
target depends on it, so `bazel build //server:server //worker:worker`
never runs pkg-config for gtest and works where only the main set is
installed; a test built there fails at fetch time, naming the set to install.
"""

# target name -> pkg-config modules. Headers live in /usr/include, which the
# auto-configured toolchain already treats as a system include directory.
# What the daemons link: deploy/setup.sh's main set.
_PKG_CONFIG_LIBS = {
    "absl": [
        "absl_base",
        "absl_flags",
        "absl_flags_parse",
        "absl_flags_usage",
        "absl_hash",
        "absl_raw_hash_set",
        "absl_random_random",
        "absl_status",
        "absl_statusor",
        "absl_str_format",
        "absl_strings",
        "absl_synchronization",
        "absl_time",
    ],
    "grpc": ["grpc++", "grpc"],
    # nlohmann-json3-dev: header-only; the target documents the dependency.
    "json": ["nlohmann_json"],
    "protobuf": ["protobuf"],
    # libgoogle-perftools-dev: tcmalloc, the daemons' allocator, linked by
    # //common:process_tuning (see process_tuning.h for the measured reason).
    "tcmalloc": ["libtcmalloc_minimal"],
    # prometheus-cpp-dev: the metrics registry and its HTTP exposer.
    "prometheus": ["prometheus-cpp-pull", "prometheus-cpp-core"],
    "zlib": ["zlib"],
}

# What only tests and benchmarks link: deploy/setup.sh's test set
# (libgtest-dev, libgmock-dev, libbenchmark-dev).
_PKG_CONFIG_TEST_LIBS = {
    "benchmark": ["benchmark"],
    "gtest": ["gtest", "gmock"],
    "gtest_main": ["gtest_main", "gmock"],
}

# The targets of @system that are @system_test's: the BUILD files name them
# @system//:gtest_main and so on, and an alias is only followed (and
# @system_test only fetched) when something being built depends on it.
_TEST_ALIASES = ["benchmark", "benchmark_main", "gtest", "gtest_main"]

def _pkg_config(ctx, modules, flag, setup):
    result = ctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail("pkg-config %s %s failed: %s\nRun `deploy/setup.sh %s` to install them." %
             (flag, " ".join(modules), result.stderr, setup))
    return [f for f in result.stdout.strip().split(" ") if f]

# BUILD lines declaring one cc_library per entry of `libs` (name -> modules).
def _pkg_config_libraries(ctx, libs, setup):
    lines = []
    for name, modules in sorted(libs.items()):
        linkopts = _pkg_config(ctx, modules, "--libs", setup)
        cflags = [f for f in _pkg_config(ctx, modules, "--cflags", setup) if f.startswith("-D")]
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    linkopts = %s," % repr(linkopts + ["-lpthread"]))
        lines.append("    defines = %s," % repr([f[2:] for f in cflags]))
        lines.append(")")
        lines.append("")
    return lines

def _system_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    lines += _pkg_config_libraries(ctx, _PKG_CONFIG_LIBS, "main")
    for name in _TEST_ALIASES:
        lines.append('alias(name = "%s", actual = "@%s//:%s")' % (name, ctx.attr.test_libs, name))

    # The code generators, for proto/ genrules.
    for tool in ["protoc", "grpc_cpp_plugin"]:
        path = ctx.which(tool)
        if path == None:
            fail("%s not found; run `deploy/setup.sh main`" % tool)
        ctx.symlink(path, tool)
    lines.append('cc_library(name = "grpc_health", linkopts = ["-lgrpc++_reflection"], deps = [":grpc"])')
    # libdnnl-dev (oneDNN 2.6, built by Debian against GCC's OpenMP) ships CMake
    # files and no .pc file. libgomp is named too: kernels/conv_dnnl.cc sets
    # the OpenMP thread count of the threads that run oneDNN's primitives.
    if not ctx.path("/usr/include/oneapi/dnnl/dnnl.hpp").exists:
        fail("oneDNN's headers (/usr/include/oneapi/dnnl) not found; run `deploy/setup.sh main`")
    lines.append('cc_library(name = "dnnl", linkopts = ["-ldnnl", "-lgomp"])')
    lines.append('exports_files(["protoc", "grpc_cpp_plugin"])')
    ctx.file("BUILD", "\n".join(lines) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
    attrs = {
        # The system_test_libs repository the test-only aliases point at.
        "test_libs": attr.string(mandatory = True),
    },
)

def _system_test_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    lines += _pkg_config_libraries(ctx, _PKG_CONFIG_TEST_LIBS, "test")
    # Debian's libbenchmark-dev ships libbenchmark_main without a .pc file.
    lines.append('cc_library(name = "benchmark_main", linkopts = ["-lbenchmark_main"], deps = [":benchmark"])')
    ctx.file("BUILD", "\n".join(lines) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_test_libs = repository_rule(
    implementation = _system_test_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)

_CUDA_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**", "include/nv/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublas", "-lcublasLt"],
    deps = [":cudart"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cudart"],
)

exports_files(["nvcc"])
"""

_NO_CUDA_BUILD = """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit on this machine: //:cuda_enabled never matches, so nothing
# depends on these.
[cc_library(name = n) for n in ["cuda_headers", "cudart", "cublas", "nccl"]]

genrule(
    name = "nvcc_missing",
    outs = ["nvcc"],
    cmd = "echo 'echo no CUDA toolkit on this machine >&2; exit 1' > $@",
    executable = True,
)
"""

def _local_cuda_impl(ctx):
    cuda = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    found = ctx.path(cuda + "/bin/nvcc").exists
    if found:
        ctx.symlink(cuda + "/include", "include")
        ctx.symlink(cuda + "/bin/nvcc", "nvcc")
        lib = str(ctx.path(cuda + "/lib64").realpath)
        ctx.file("BUILD", _CUDA_BUILD.replace("{lib}", lib))
    else:
        print("no CUDA toolkit at %s: building CPU-only" % cuda)
        ctx.file("BUILD", _NO_CUDA_BUILD)
    ctx.file("defs.bzl", "CUDA_FOUND = %s\nCUDA_PATH = %r\n" % (found, cuda))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    local = True,
    environ = ["CUDA_PATH"],
)
