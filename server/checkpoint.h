#ifndef PS_SERVER_CHECKPOINT_H_
#define PS_SERVER_CHECKPOINT_H_

// Parameter-server checkpoints: the server's whole state at a version
// boundary, written so that a crash at any moment leaves the previous
// checkpoints loadable, and read back refusing anything that does not check
// out. Knows no gRPC and no ParameterServer: the server calls it.
//
// Format. Checkpoint v (v = the version, written as 12 decimal digits,
// zero-padded: 000000000042; a version of 10^12 or more takes more digits)
// is three files in one directory:
//
//   params-<v>.safetensors    the parameters: one F32 tensor per signature
//                             entry, under its PyTorch name and shape,
//                             metadata {"format": "pt"} (common/safetensors.h),
//                             so PyTorch loads it with
//                               model.load_state_dict(
//                                   safetensors.torch.load_file(path),
//                                   strict=False)
//                             (strict=False: a model's buffers, such as
//                             batch-norm statistics, are not on the server).
//                             A sum-only server's (--optimizer=none) holds
//                             its newest version's values instead: the
//                             initial parameters at version 0, the mean
//                             gradient after (the parameters are the
//                             workers').
//   momentum-<v>.safetensors  only with momentum: the momentum buffers, under
//                             the same names and shapes.
//   checkpoint-<v>.json       the manifest, written last: the commit point.
//                             {"format": "ps-checkpoint",
//                              "format_version": 1,
//                              "version": 42,
//                              "steps_per_epoch": 469,
//                              "job": {"lr": "0.9", "num_workers": "2", ...},
//                              "signature": [{"name": "fc1.weight",
//                                             "dtype": "F32",
//                                             "shape": [128, 784]}, ...],
//                              "files": {"params": {"name": "params-000000000042.safetensors",
//                                                   "bytes": 407560,
//                                                   "crc32": 3735928559},
//                                        "momentum": {...}}}     (only with momentum)
//                             "crc32" is zlib's crc32 of the whole file, as an
//                             unsigned integer; "bytes" its exact size.
//
// Data files without a manifest are leftovers of a write that crashed before
// its commit point: readers ignore them, and the next successful write
// deletes them (with any "*.tmp" of the same names).
//
// Durability: every file is written to "<name>.tmp", fsynced and renamed
// into place, data files first, the manifest last, and the directory is
// fsynced after the manifest's rename (which makes the data files' renames
// durable too; WriteSafetensors' own directory fsync is best effort). So
// after a crash a manifest is either absent (the checkpoint never happened)
// or complete with all its data durable.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/param_spec.h"

namespace ps::server {

// The manifest's "format_version"; a reader refuses every other.
inline constexpr int kCheckpointFormatVersion = 1;
// Largest manifest LoadNewestCheckpoint reads, in bytes (a signature of
// 100,000 tensors takes about 8 MB). Bounds what a corrupt manifest can make
// it allocate (its parse takes memory proportional to its length); the data
// files are bounded by their real sizes.
inline constexpr int64_t kMaxManifestBytes = 16 << 20;

// What one checkpoint holds: the server's whole state at a version boundary.
struct CheckpointContents {
  int64_t version = 0;          // parameters after `version` updates; >= 0
  int64_t steps_per_epoch = 0;  // the job's (0: not stated), for the schedule's position; >= 0
  // Settings the job was started with that a resumed server must share (e.g.
  // "num_workers" -> "2", "lr" -> "0.9", "momentum" -> "0.9", "shard" -> "0/1").
  // Free-form UTF-8 strings, stored and returned as they are; the caller
  // compares them.
  std::map<std::string, std::string> job;
  // The trainable parameters' names and shapes, in key order: non-empty, F32
  // only, names unique, non-empty, valid UTF-8 and not "__metadata__".
  std::vector<ParamSpec> signature;
  // Flat, in signature order: the sum of the signature's element counts.
  std::vector<float> parameters;
  // Empty (no momentum) or the same size as parameters, laid out alike.
  std::vector<float> momentum;
  // Dynamic loss scaling's state (ParameterServer::State); scale 0: none,
  // and the manifest has no "loss_scale" then.
  float loss_scale = 0;
  int64_t loss_scale_clean_iterations = 0;
  int64_t loss_scale_skipped_iterations = 0;
};

struct CheckpointOptions {
  // Where the checkpoints live; created (with its parents) if missing.
  std::string directory;
  // How many checkpoints to keep, >= 1: after a successful write, every
  // checkpoint but the one just written and the keep - 1 newest older ones
  // (by version) is deleted. Counted by manifest, valid or not: checking
  // every file's CRC-32 on each write would cost a read of each. One newer
  // than the one just written is of an abandoned history (a server that
  // resumed from an older checkpoint, the newer ones refused at its start)
  // and is deleted too: kept, a later start would resume from it and
  // throw away the run since.
  int keep = 3;
};

// Writes checkpoint `contents.version` into options.directory (see Format
// above) and then deletes the checkpoints beyond options.keep and any
// leftovers of crashed writes. Returns the manifest's path
// (options.directory + "/checkpoint-<v>.json").
//
// Writing a version that is already there replaces it: its manifest is
// deleted first, so a crash midway leaves that version absent (and the
// others intact), never a manifest over half-replaced data.
//
// Blocks for the whole write, fsyncs included, and a read of each data file
// back for its CRC-32 (11M parameters with momentum, 88 MB: 0.2-0.3 s on an
// ext4 virtual disk, server/checkpoint_test's timing). Memory: one copy of
// the parameters, then of the momentum, while each is written. Calls for
// different directories may run at once; calls for one directory must not
// overlap (one writer per directory: each call's clean-up deletes files
// another's write has not committed yet). LoadNewestCheckpoint may run
// during a write: it never sees a manifest before its data; a checkpoint
// the clean-up deletes under it is refused (missing file) and it goes on to
// older ones.
//
// Errors:
//   kInvalidArgument  nothing touched on disk: an empty directory, keep < 1,
//                     a negative version or steps_per_epoch, an empty
//                     signature, a non-F32 entry, a negative dimension, a
//                     duplicate, empty, reserved or non-UTF-8 name, a
//                     non-UTF-8 job entry, parameters of the wrong size or
//                     momentum neither empty nor as large.
//   others            from the file system (errno's mapping, e.g.
//                     kPermissionDenied, kResourceExhausted for a full disk,
//                     kFailedPrecondition when a path component is not a
//                     directory), naming the file: before the manifest's
//                     rename nothing of the new checkpoint is committed and
//                     the older ones are untouched (the version written, if
//                     it was there before, is gone); a failure after it (the
//                     directory's fsync or the clean-up, whose message says
//                     so) leaves the new checkpoint committed.
absl::StatusOr<std::string> WriteCheckpoint(const CheckpointOptions& options,
                                            const CheckpointContents& contents);

struct LoadedCheckpoint {
  CheckpointContents contents;
  std::string manifest_path;
};

// The newest valid checkpoint in `directory`, by the version in the
// manifests' file names (names not of the form checkpoint-<v>.json, v
// written as WriteCheckpoint writes it, are ignored, as are data files).
// A checkpoint is valid when:
//   - the manifest is a regular file of at most kMaxManifestBytes, parses as
//     JSON, has every field above with the right type and no other, format
//     "ps-checkpoint", format_version kCheckpointFormatVersion, a version
//     equal to its file name's, steps_per_epoch >= 0, a non-empty signature
//     of unique names with F32 dtypes and shapes of at most 64 non-negative
//     dimensions, and lists each data file under its own name
//     (params-<v>.safetensors, momentum-<v>.safetensors);
//   - each listed file exists, is a regular file of exactly the listed size
//     (a shorter one is reported as truncated) and CRC-32;
//   - each parses as a safetensors file (ReadSafetensors) whose tensors are
//     exactly the signature's names, each F32 with the signature's shape.
// Checkpoints are tried newest first; each newer one that is refused is
// appended to `*refused` (when not null) as one message naming the manifest,
// the file at fault and the problem, e.g.
//   ".../checkpoint-000000000042.json: .../params-000000000042.safetensors:
//    truncated: 1000 bytes, the manifest lists 4096"
// Nothing is allocated from a manifest's numbers before they are checked
// against the real files' sizes. Reads each data file twice (CRC-32, then
// parse; 88 MB in about 0.1 s); memory peaks at the values returned plus
// one data file's bytes. Thread-safe; reads only.
//
// Errors:
//   kNotFound            `directory` does not exist, or holds no manifest.
//   kDataLoss            it holds manifests but none is valid; the message
//                        lists why each was refused.
//   kFailedPrecondition  `directory` is not a directory.
//   others               listing the directory failed (errno's mapping,
//                        e.g. kPermissionDenied).
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& directory,
                                                      std::vector<std::string>* refused);

// The versions of the manifests in `directory` (valid or not), ascending;
// empty when it does not exist. Errors as LoadNewestCheckpoint's listing.
absl::StatusOr<std::vector<int64_t>> ListCheckpointVersions(const std::string& directory);

// Checkpoint `version` of `directory`, checked as LoadNewestCheckpoint checks
// each; its error names the manifest and the problem (kNotFound when there
// is no such manifest, kInvalidArgument for a version below 0).
// Thread-safe; reads only.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointOfVersion(const std::string& directory,
                                                         int64_t version);

// Where SetAsideCheckpointsAfter moves checkpoints, under the directory.
inline constexpr char kAbandonedCheckpointsDirectory[] = "abandoned";

// Moves every checkpoint newer than `version` (manifests first, then their
// data files) into the subdirectory kAbandonedCheckpointsDirectory of
// `directory`, replacing files of the same names there, so that the resume
// scan (LoadNewestCheckpoint) finds `version` or older, and an operator can
// still look at what a restore went back from. Not concurrent with a
// WriteCheckpoint to the same directory. Errors from the file system,
// naming the file; what was moved before stays moved.
absl::Status SetAsideCheckpointsAfter(const std::string& directory, int64_t version);

// The file names checkpoint `version` uses (no directory): "params-<v>.safetensors",
// "momentum-<v>.safetensors", "checkpoint-<v>.json". version >= 0.
std::string CheckpointParamsFileName(int64_t version);
std::string CheckpointMomentumFileName(int64_t version);
std::string CheckpointManifestFileName(int64_t version);

}  // namespace ps::server

#endif  // PS_SERVER_CHECKPOINT_H_
