#ifndef PS_TESTS_CONTAINERS_H_
#define PS_TESTS_CONTAINERS_H_

// Running podman from the tests that bring up the images (compose_test,
// k8s_play_test, tagged "container"): with the settings these machines
// need (deploy/images/containers.conf, a runfile of the test) and
// /usr/sbin on PATH, where podman's network plugins find iptables (Bazel's
// strict test PATH lacks it).

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps::tests {

// Runs the shell `command` (podman, podman-compose, ...) so; its exit code,
// its stdout in *output.
int RunWithPodman(const std::string& command, std::string* output);

// Success when every image exists; otherwise a failure naming the missing
// one and the command that builds them.
::testing::AssertionResult ImagesBuilt(const std::vector<std::string>& images);

}  // namespace ps::tests

#endif  // PS_TESTS_CONTAINERS_H_
