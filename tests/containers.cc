#include "tests/containers.h"

#include "common/testing/subprocess.h"

namespace ps::tests {

int RunWithPodman(const std::string& command, std::string* output) {
  const std::string conf = testing::RunfilePath("deploy/images/containers.conf");
  return testing::RunCommand(
      "export PATH=/usr/sbin:/sbin:$PATH CONTAINERS_CONF=" + testing::ShellQuote(conf) + "; " +
          command,
      output);
}

::testing::AssertionResult ImagesBuilt(const std::vector<std::string>& images) {
  std::string output;
  for (const std::string& image : images) {
    if (RunWithPodman("podman image exists " + image, &output) != 0) {
      return ::testing::AssertionFailure()
             << "the image " << image << " is missing: run `bash deploy/images/build.sh` first";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ps::tests
