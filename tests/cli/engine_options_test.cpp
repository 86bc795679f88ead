// The engine flags' defaults that depend on the backend (in-process: EngineFlags::to_config).
#include <gtest/gtest.h>

#include "cli/engine_options.h"

namespace hyspec::cli {
namespace {

EngineConfig config_of(const std::string& backend, const std::string& kv_type) {
  EngineFlags f;
  f.model = "model.gguf";  // to_config does not open it
  f.backend = backend;
  f.kv_type = kv_type;
  auto c = f.to_config();
  EXPECT_TRUE(c.is_ok()) << (c.is_ok() ? "" : c.message());
  return c.is_ok() ? *c : EngineConfig{};
}

TEST(EngineFlags, KvCacheDefaultsToF16OnCudaAndF32OnTheCpu) {
  EXPECT_EQ(config_of("cuda", "").kv_type, GgmlType::F16);
  EXPECT_EQ(config_of("cpu", "").kv_type, GgmlType::F32);
  // A type given is kept on either backend.
  EXPECT_EQ(config_of("cuda", "f32").kv_type, GgmlType::F32);
  EXPECT_EQ(config_of("cpu", "f16").kv_type, GgmlType::F16);
  EXPECT_EQ(config_of("cuda", "q8_0").kv_type, GgmlType::Q8_0);
  EXPECT_EQ(config_of("cpu", "bf16").kv_type, GgmlType::BF16);
}

TEST(EngineFlags, DraftMaxDefaultKeepsVerifyStepsAtSixteenRows) {
  EXPECT_EQ(config_of("cpu", "").draft_max, 15);
}

// --pad-verify as a user writes it: auto by default (padded where steps are recorded as graphs), on, off,
// and anything else refused at parse time.
TEST(EngineFlags, PadVerifyTakesAutoOnOrOff) {
  const auto parsed = [](const std::string& args) {
    CLI::App app;
    EngineFlags f;
    f.add_to(app);
    app.parse(args, false);
    f.model = "model.gguf";
    auto c = f.to_config();
    EXPECT_TRUE(c.is_ok());
    return c.is_ok() ? c->pad_verify : PadVerify::kAuto;
  };
  EXPECT_EQ(parsed(""), PadVerify::kAuto);
  EXPECT_EQ(parsed("--pad-verify auto"), PadVerify::kAuto);
  EXPECT_EQ(parsed("--pad-verify on"), PadVerify::kOn);
  EXPECT_EQ(parsed("--pad-verify off"), PadVerify::kOff);
  EXPECT_THROW(parsed("--pad-verify yes"), CLI::ValidationError);
  EngineFlags f;  // set without the parser (a caller of to_config): refused, not taken for auto
  f.model = "model.gguf";
  f.pad_verify = "yes";
  EXPECT_FALSE(f.to_config().is_ok());
}

}  // namespace
}  // namespace hyspec::cli
