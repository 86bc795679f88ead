// Where hyspec finds its default model family (models/README.md) when no -m is given.
// Search order, first existing file wins:
//   1. $HYSPEC_MODEL (target) / $HYSPEC_DRAFT_MODEL (DFlash drafter), used as given even if missing,
//      so a typo is reported instead of silently replaced;
//   2. <directory of the running executable>/../models/<file> (an installed bin/ + models/ layout,
//      and build/hyspec inside the source tree);
//   3. the source tree's models/<file> (HYSPEC_MODELS_DIR, set at build time).
// Returns "" when none exists.
#pragma once
#include <string>

namespace hyspec::cli {

inline constexpr const char* kDefaultModelFile = "qwen35-demo-q8_0.gguf";
inline constexpr const char* kDefaultDraftModelFile = "qwen35-demo-dflash-q8_0.gguf";

std::string default_model_path();
std::string default_draft_model_path();

}  // namespace hyspec::cli
