#include "cli/default_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace hyspec::cli {
namespace {

namespace fs = std::filesystem;

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

std::string find(const char* env, const char* file) {
  if (const char* v = std::getenv(env); v && *v) return v;
  std::error_code ec;
  std::vector<fs::path> candidates;
  if (const fs::path dir = executable_dir(); !dir.empty()) candidates.push_back(dir / ".." / "models" / file);
#ifdef HYSPEC_MODELS_DIR
  candidates.push_back(fs::path(HYSPEC_MODELS_DIR) / file);
#endif
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p, ec)) {
      const fs::path canonical = fs::weakly_canonical(p, ec);
      return ec ? p.string() : canonical.string();
    }
  return {};
}

}  // namespace

std::string default_model_path() { return find("HYSPEC_MODEL", kDefaultModelFile); }
std::string default_draft_model_path() { return find("HYSPEC_DRAFT_MODEL", kDefaultDraftModelFile); }

}  // namespace hyspec::cli
