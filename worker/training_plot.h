#ifndef PS_WORKER_TRAINING_PLOT_H_
#define PS_WORKER_TRAINING_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "worker/training_report.h"

namespace ps::worker {

// Draws the report's per-epoch curves as a PNG at `png_path`, as Dive into
// Deep Learning's training function shows them: training loss, and training,
// validation and test accuracy, against the epoch (a curve only where the
// report has values). Drawn by Debian's matplotlib (python3-matplotlib, Agg
// backend, no display), run by `python3` (/usr/bin/python3 first) with the
// report on its stdin; the PNG carries the plotted numbers as its text chunk
// "ps-curves" (JSON: epoch, train_loss, train_accuracy, validation_accuracy,
// test_accuracy lists), so a reader can check the drawing against them.
// Written through a temporary file and renamed: a reader sees the previous
// PNG or the new one. kUnavailable when no python3 with matplotlib runs;
// kInternal naming the program's last words when it fails.
absl::Status PlotTrainingCurves(const TrainingReport& report, const std::string& png_path);

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINING_PLOT_H_
