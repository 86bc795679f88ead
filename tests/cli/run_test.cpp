// `hyspec run` as a user runs it: transformers' greedy continuations reproduced from token ids, the
// same ids with every drafter, and clear one-line errors for prompts that do not fit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "common/fixtures.h"

namespace hyspec {
namespace {

struct Output {
  int exit_code = -1;
  std::string out, err;
};

Output hyspec(const std::string& args) {
  // One file per test process: ctest runs tests in parallel.
  const std::string err_file = testing::TempDir() + "/hyspec_run_stderr_" + std::to_string(getpid()) + ".txt";
  const std::string cmd = "'" + test::hyspec_binary() + "' " + args + " 2>'" + err_file + "'";
  Output r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = test::read_text_file(err_file);
  return r;
}

std::string join(const std::vector<int32_t>& ids, char sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? std::string(1, sep) : "") + std::to_string(ids[i]);
  return s;
}

std::vector<int32_t> parse_ids(const std::string& out) {
  std::vector<int32_t> ids;
  std::istringstream in(out);
  int32_t v;
  while (in >> v) ids.push_back(v);
  return ids;
}

TEST(CliRun, ReproducesTransformersGreedyContinuationsFromTokenIds) {
  for (const std::string dir : {"qwen35-tiny", "qwen35moe-tiny"}) {
    const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
    const std::string model = test::fixture_path(dir + "/" + dir + "-f32.gguf");
    int checked = 0;
    for (const auto& c : manifest["cases"]) {
      if (!c.contains("greedy_continuation")) continue;
      const auto want = c["greedy_continuation"].get<std::vector<int32_t>>();
      for (const std::string spec : {"none", "mtp", "ngram"}) {
        const Output o = hyspec("run -m '" + model + "' --tokens " + join(c["tokens"].get<std::vector<int32_t>>(), ',') +
                                " -n " + std::to_string(want.size()) + " --temp 0 --ids --no-stats -t 2 --spec " + spec);
        ASSERT_EQ(o.exit_code, 0) << o.err;
        EXPECT_EQ(parse_ids(o.out), want) << dir << "/" << c["name"] << " --spec " << spec;
      }
      ++checked;
    }
    EXPECT_GT(checked, 0) << dir << ": no case with a greedy continuation";
  }
}

TEST(CliRun, PromptLongerThanTheContextIsAOneLineError) {
  const std::string model = test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf");
  const Output o = hyspec("run -m '" + model + "' --tokens 1,2,3,4,5,6,7,8 -c 6 -n 4 --temp 0 --ids");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("error: the prompt has 8 tokens but the context holds 6 (exceeds it by 3"), std::string::npos)
      << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}

TEST(CliRun, MissingOrCorruptModelIsAOneLineError) {
  const Output o = hyspec("run -m /nonexistent/model.gguf -p hi");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err.rfind("error: /nonexistent/model.gguf: cannot open", 0), 0u) << o.err;
  const Output v = hyspec("run -m '" + test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf") + "' -p hi");
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find("unsupported architecture"), std::string::npos) << v.err;
}

TEST(CliRun, PrintsSpeedAndAcceptanceStatistics) {
  const std::string model = test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf");
  const Output o = hyspec("run -m '" + model + "' -p 'Hello world' -n 16 --temp 0 --spec mtp -t 1");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const char* want : {"prompt: ", "generation: ", "speculative (mtp): ", "mean acceptance length",
                           "acceptance histogram", "time per phase: draft"})
    EXPECT_NE(o.err.find(want), std::string::npos) << want << " missing in:\n" << o.err;
}

}  // namespace
}  // namespace hyspec
