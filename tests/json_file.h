#ifndef PS_TESTS_JSON_FILE_H_
#define PS_TESTS_JSON_FILE_H_

// Reading the JSON files the daemons and scripts write (reports, traces,
// results), for the multi-process tests.

#include <string>

#include "nlohmann/json.hpp"

namespace ps::tests {

// The JSON document at `path`; a missing, empty or malformed file is a test
// failure (naming the path) and gives a discarded value.
nlohmann::json ReadJsonFile(const std::string& path);

}  // namespace ps::tests

#endif  // PS_TESTS_JSON_FILE_H_
