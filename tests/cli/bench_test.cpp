// `hyspec bench --json` run as a user would, on the CPU and the tiny dense fixture: the rows asked for,
// in order, and each row's "x tg step" against the right tg step (verify rows at a depth: that depth's).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/process.h"

namespace hyspec {
namespace {

nlohmann::json run_bench_json(const std::string& args) {
  const std::string path = test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf");
  const test::CommandResult r =
      test::run_command("'" + test::hyspec_binary() + "' bench -m '" + path + "' -t 2 --json " + args);  // stderr, joined, is empty unless it fails
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output, nullptr, false);
}

std::vector<std::string> tests_of(const nlohmann::json& rows) {
  std::vector<std::string> names;
  for (const auto& row : rows) names.push_back(row["test"].get<std::string>());
  return names;
}

// Field `key` of the row named `test`.
double field(const nlohmann::json& rows, const std::string& test, const char* key) {
  for (const auto& row : rows)
    if (row["test"] == test) return row[key].get<double>();
  ADD_FAILURE() << "no row " << test;
  return 0;
}
double step_ms(const nlohmann::json& rows, const std::string& test) { return field(rows, test, "ms_per_step"); }
double ratio(const nlohmann::json& rows, const std::string& test) { return field(rows, test, "ratio_to_tg"); }

TEST(BenchCli, VerifyAtDepthRowsAreAgainstThatDepthsDecodeStep) {
  const nlohmann::json rows = run_bench_json("-p 0 -n 4 -d 0,48 --verify 1,3 --verify-at-depth -c 128");
  ASSERT_TRUE(rows.is_array());
  EXPECT_EQ(tests_of(rows), (std::vector<std::string>{"tg4", "tg4 @ d48", "verify-1", "verify-3", "verify-1 @ d48",
                                                      "verify-3 @ d48", "rollback-1", "rollback-3"}));
  const double tg0 = step_ms(rows, "tg4"), tg48 = step_ms(rows, "tg4 @ d48");
  EXPECT_NEAR(ratio(rows, "tg4 @ d48"), tg48 / tg0, 1e-9);
  EXPECT_NEAR(ratio(rows, "verify-3"), step_ms(rows, "verify-3") / tg0, 1e-9);
  EXPECT_NEAR(ratio(rows, "verify-3 @ d48"), step_ms(rows, "verify-3 @ d48") / tg48, 1e-9);
  // The rollback after a verify step (no tokens, no weights): against the depth-0 decode step.
  EXPECT_GT(step_ms(rows, "rollback-3"), 0.0);
  EXPECT_NEAR(ratio(rows, "rollback-3"), step_ms(rows, "rollback-3") / tg0, 1e-9);
}

TEST(BenchCli, VerifyStaysAtDepthZeroWithoutTheFlag) {
  const nlohmann::json rows = run_bench_json("-p 0 -n 2 -d 0,16 --verify 2 -c 64");
  ASSERT_TRUE(rows.is_array());
  EXPECT_EQ(tests_of(rows), (std::vector<std::string>{"tg2", "tg2 @ d16", "verify-2", "rollback-2"}));
  // Depths without 0 still verify at depth 0 (no tg step there to divide by: ratio 0).
  const nlohmann::json deep = run_bench_json("-p 0 -n 2 -d 16 --verify 2 -c 64");
  ASSERT_TRUE(deep.is_array());
  EXPECT_EQ(tests_of(deep), (std::vector<std::string>{"tg2 @ d16", "verify-2", "rollback-2"}));
  EXPECT_EQ(ratio(deep, "verify-2"), 0.0);
  EXPECT_EQ(ratio(deep, "tg2 @ d16"), 0.0);
}

}  // namespace
}  // namespace hyspec
