# What the GPU bundle holds, sourced by deploy/dev/gpu/build_bundle.sh and by
# //deploy/dev/gpu:bundle_scripts_test. Each list is Bazel labels; a binary keeps
# its target's name in the bundle, so the names must be unique.
# shellcheck shell=bash disable=SC2034  # the lists are read by the scripts that source this

# Every cc_test whose sources have CUDA cases (PS_SKIP_WITHOUT_GPU, "no
# usable CUDA GPU", PS_WITH_CUDA or CudaGpuCount): the kernels against their
# CPU references, devices, the collectives, the trainer and the models on
# GPUs, and the two tests of thread stacks beside CUDA's static TLS.
# build_bundle.sh fails when a test source with such cases is missing here.
GPU_TESTS=(
  //common:cublas_library_test
  //common:device_test
  //common:metrics_test
  //common:thread_stack_test
  //kernels:activation_pool_test
  //kernels:activation_test
  //kernels:batch_norm_test
  //kernels:conv_test
  //kernels:elementwise_test
  //kernels:gemm_test
  //kernels:linear_test
  //kernels:pool_test
  //kernels:sgd_test
  //kernels:softmax_cross_entropy_test
  //worker:collective_test
  //worker:trainer_gpu_test
  //worker/model:model_test
)

# Figures, not pass/fail (tagged "benchmark" in their BUILD files).
BENCHMARKS=(
  //kernels:kernels_benchmark
  //worker:trainer_benchmark
  //worker/model:model_benchmark
)

DAEMONS=(
  //server:server
  //server:health_check
  //worker:worker
)

# Runfiles the tests read ($TEST_SRCDIR/$TEST_WORKSPACE/<path>), as
# repository paths.
TEST_DATA=(
  worker/model/testdata/torch_golden.txt
  worker/model/testdata/torch_specs.txt
)

# Scripts the PyTorch comparison runs: bundle path = repository path.
PY_FILES=(
  py/pytorch_gpu.py=deploy/dev/gpu/pytorch_gpu.py
  py/torch_models.py=worker/model/torch_models.py
)
