// Locating oracle data: HYSPEC_FIXTURES (default ../shared/fixtures). Missing fixtures fail loudly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace hyspec::test {

// Absolute path of a file under the fixtures directory; fails the current test (FATAL) if absent.
std::string fixture_path(const std::string& relative);
std::vector<float> read_f32_file(const std::string& path);
nlohmann::json read_json_file(const std::string& path);
std::string read_text_file(const std::string& path);
// The hyspec CLI the server/CLI tests spawn: HYSPEC_BIN, else the one built with the tests.
std::string hyspec_binary();
// The backend the model and engine tests run on: HYSPEC_TEST_BACKEND=cuda|cpu (default cpu), so the
// same fixture tests run on the CPU and, on a GPU machine, on CUDA (scripts/device/test.sh).
BackendKind test_backend_kind();
std::string source_dir();

}  // namespace hyspec::test
