#ifndef PS_COMMON_REGULAR_FILE_H_
#define PS_COMMON_REGULAR_FILE_H_

#include <sys/stat.h>

#include <string>

#include "absl/status/statusor.h"

namespace ps {

// Opens `path` for reading, only if it is a regular file. The open itself
// does not block (O_NONBLOCK), so a FIFO or a device named where a file
// (weights, a checkpoint, a certificate, a token) belongs is refused instead
// of waited on forever; the returned descriptor reads blocking again.
// *stat, when given, is the file's fstat. The caller closes the descriptor.
// Errors name `path`: kNotFound when it does not exist, kFailedPrecondition
// when it is not a regular file, the errno's status otherwise.
absl::StatusOr<int> OpenRegularFile(const std::string& path, struct stat* stat = nullptr);

}  // namespace ps

#endif  // PS_COMMON_REGULAR_FILE_H_
