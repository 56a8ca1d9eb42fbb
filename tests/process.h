#ifndef PS_TESTS_PROCESS_H_
#define PS_TESTS_PROCESS_H_

// The daemons as child processes, for the multi-process tests: start one
// with its output in a log file, wait for it, signal it, read its log.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ps::tests {

// A child process with stdout and stderr sent to a log file. Killed
// (SIGKILL) and reaped on destruction if it has not exited. Not thread-safe.
class Process {
 public:
  // kOwn: the child leads a process group of its own, which every process
  // it starts joins unless it leaves it; GroupAlive() then says whether any
  // is left, and destruction kills the whole group (a script's children
  // too).
  enum class Group { kInherit, kOwn };
  // Starts `binary` with `args` (a failure to start is a test failure).
  Process(const std::string& binary, std::vector<std::string> args, const std::string& log,
          Group group = Group::kInherit);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits for exit (up to `timeout`); returns the exit code, or -1 on
  // timeout or a signal.
  int Wait(std::chrono::seconds timeout);
  void Signal(int sig);
  pid_t pid() const { return pid_; }
  // With Group::kOwn: whether any process of the group is left (the child
  // itself counts until Wait has reaped it).
  bool GroupAlive() const;
  // The log so far.
  std::string Log() const;

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
  Group group_ = Group::kInherit;
};

// The port a server wrote to `path` (--port_file); 0 if none within 30 s.
int WaitForPortFile(const std::string& path);

// Waits until `process`'s log contains `text`; false after `timeout`.
bool WaitForLog(const Process& process, const std::string& text, std::chrono::seconds timeout);

}  // namespace ps::tests

#endif  // PS_TESTS_PROCESS_H_
