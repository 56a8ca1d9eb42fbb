#ifndef PS_COMMON_TESTING_SUBPROCESS_H_
#define PS_COMMON_TESTING_SUBPROCESS_H_

// Helpers for tests that run other programs or write files: paths under
// Bazel's test environment, reading a file back, shell quoting, running a
// command, and finding a Python with PyTorch to serve as an oracle.

#include <string>

namespace ps::testing {

// `name` inside the test's private temporary directory ($TEST_TMPDIR).
std::string TestTmpPath(const std::string& name);

// The whole contents of the file at `path` ("" when it cannot be read).
std::string ReadFileBytes(const std::string& path);

// A data dependency's path, given relative to the workspace root (e.g.
// "server/server"), inside the test's runfiles.
std::string RunfilePath(const std::string& workspace_relative);

// `s` single-quoted for /bin/sh.
std::string ShellQuote(const std::string& s);

// Runs `command` through the shell; returns its exit code (-1 if it did not
// exit normally) and puts its stdout and stderr in *output.
int RunCommand(const std::string& command, std::string* output);

// The first interpreter that can `import <modules>` (e.g. "torch, numpy"):
// Debian's /usr/bin/python3 first, where python3-torch lives, then python3
// on PATH. Empty when there is none.
std::string FindPython(const std::string& modules);

}  // namespace ps::testing

#endif  // PS_COMMON_TESTING_SUBPROCESS_H_
