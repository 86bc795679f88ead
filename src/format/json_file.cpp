#include "format/json_file.h"

#include "util/mmap_file.h"

namespace hyspec {

Result<nlohmann::json> read_json_object(const std::string& path) {
  HS_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  nlohmann::json j = nlohmann::json::parse(f.data(), f.data() + f.size(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::errorf("{}: not a JSON object", path);
  return j;
}

}  // namespace hyspec
