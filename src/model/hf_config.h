// Typed lookups in a Hugging Face config.json whose errors name the file and the key. Shared by
// the DFlash HF loader and the HF -> GGUF converter.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "format/json_file.h"
#include "util/status.h"

namespace hyspec {

struct HfConfig {
  const nlohmann::json& j;
  std::string path;

  // obj[key] as T; `def` when absent or null, an error when absent without a default or mistyped.
  template <typename T>
  Result<T> get(const nlohmann::json& obj, const char* key, std::optional<T> def = std::nullopt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (def) return *def;
      return Status::errorf("{}: missing '{}'", path, key);
    }
    try {
      return it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      return Status::errorf("{}: '{}' has the wrong type ({})", path, key, it->dump());
    }
  }
};

}  // namespace hyspec
