// A JSON file (Hugging Face config.json, tokenizer.json, ...) read as one JSON object; errors
// name the file.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "util/status.h"

namespace hyspec {

Result<nlohmann::json> read_json_object(const std::string& path);

}  // namespace hyspec
