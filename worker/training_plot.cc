#include "worker/training_plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ps::worker {
namespace {

// The plotting program: the report's JSON on stdin, the PNG's path as its
// argument.
constexpr char kProgram[] = R"PY(
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

report = json.load(sys.stdin)
path = sys.argv[1]
epochs = report.get("epochs", [])
def series(key):
    return [e[key] if e.get(key) is not None and e[key] >= 0 else None for e in epochs]
curves = {
    "epoch": [e["epoch"] for e in epochs],
    "train_loss": series("train_loss"),
    "train_accuracy": series("train_accuracy"),
    "validation_accuracy": series("validation_accuracy"),
    "test_accuracy": series("test_accuracy"),
}
fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.5))
def draw(ax, key, label, style):
    points = [(x, y) for x, y in zip(curves["epoch"], curves[key]) if y is not None]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
draw(loss_ax, "train_loss", "train loss", "b-")
draw(acc_ax, "train_accuracy", "train acc", "m--")
draw(acc_ax, "validation_accuracy", "validation acc", "g-.")
draw(acc_ax, "test_accuracy", "test acc", "r:")
for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy")):
    ax.set_xlabel("epoch")
    ax.set_ylabel(name)
    ax.grid(True)
    if ax.get_lines():
        ax.legend()
fig.suptitle("%s, %d worker(s), global batch %d" % (
    report.get("model", "?"), report.get("num_workers", 1), report.get("global_batch_size", 0)))
fig.tight_layout()
tmp = path + ".tmp"
fig.savefig(tmp, format="png", dpi=80, metadata={"ps-curves": json.dumps(curves)})
os.replace(tmp, path)
)PY";

// Runs `python` with the program, `input` on its stdin; its exit code (-1
// if it did not start or exit normally), its stderr in *errors.
int RunPython(const std::string& python, const std::string& png, const std::string& input,
              std::string* errors) {
  int in[2], err[2];
  if (pipe(in) != 0) return -1;
  if (pipe(err) != 0) {
    close(in[0]);
    close(in[1]);
    return -1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  posix_spawn_file_actions_addclose(&actions, err[0]);
  std::vector<std::string> args = {python, "-c", kProgram, png};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = python.find('/') != std::string::npos
                          ? posix_spawn(&pid, python.c_str(), &actions, nullptr, argv.data(), environ)
                          : posix_spawnp(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(err[1]);
  if (spawned != 0) {
    close(in[1]);
    close(err[0]);
    return -1;
  }
  // The report is small (a few KB): the pipe takes it whole.
  size_t written = 0;
  while (written < input.size()) {
    const ssize_t n = write(in[1], input.data() + written, input.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  close(in[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = read(err[0], buffer, sizeof(buffer))) > 0) errors->append(buffer, n);
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

absl::Status PlotTrainingCurves(const TrainingReport& report, const std::string& png_path) {
  const std::string json = TrainingReportToJson(report);
  std::string errors;
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    errors.clear();
    const int code = RunPython(python, png_path, json, &errors);
    if (code == 0) return absl::OkStatus();
    if (code > 0 && errors.find("No module named") == std::string::npos) {
      const size_t last = errors.find_last_not_of('\n');
      const size_t line = errors.rfind('\n', last == std::string::npos ? 0 : last);
      return absl::InternalError(absl::StrCat(
          "drawing ", png_path, " failed: ",
          errors.substr(line == std::string::npos ? 0 : line + 1)));
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "no python3 with matplotlib to draw ", png_path,
      " (Debian: apt-get install python3-matplotlib)"));
}

}  // namespace ps::worker
