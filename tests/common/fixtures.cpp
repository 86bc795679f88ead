#include "common/fixtures.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hyspec::test {

std::string fixture_path(const std::string& relative) {
  const char* env = std::getenv("HYSPEC_FIXTURES");
  const std::filesystem::path root = env && *env ? env : HYSPEC_DEFAULT_FIXTURES;
  const std::filesystem::path p = root / relative;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "fixture missing: " << p << " (set HYSPEC_FIXTURES to ../shared/fixtures)";
    throw std::runtime_error("fixture missing: " + p.string());
  }
  return p.string();
}

std::vector<float> read_f32_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  in.seekg(0, std::ios::end);
  const size_t n = static_cast<size_t>(in.tellg()) / sizeof(float);
  in.seekg(0);
  std::vector<float> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json_file(const std::string& path) { return nlohmann::json::parse(read_text_file(path)); }

std::string hyspec_binary() {
  const char* env = std::getenv("HYSPEC_BIN");  // a binary carried elsewhere (the GPU machine)
  return env && *env ? env : HYSPEC_BINARY;
}

BackendKind test_backend_kind() {
  const char* env = std::getenv("HYSPEC_TEST_BACKEND");
  if (!env || std::string(env) != "cuda") return BackendKind::Cpu;
  return BackendKind::Cuda;
}
std::string source_dir() { return HYSPEC_SOURCE_DIR; }

}  // namespace hyspec::test
