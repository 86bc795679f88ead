#include "engine/spec/dflash_drafter.h"

namespace hyspec {

Result<std::shared_ptr<void>> load_dflash_weights(Qwen35Model&, const std::string& path) {
  return Status::errorf("{}: DFlash drafting is not available in this build yet", path);
}

Result<std::unique_ptr<Drafter>> make_dflash_drafter(Qwen35Model&, const std::shared_ptr<void>&, int) {
  return Status::error("DFlash drafting is not available in this build yet");
}

}  // namespace hyspec
