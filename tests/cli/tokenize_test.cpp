// `hyspec tokenize`, run as a process: --ids against the llama.cpp vocab test data, the piece
// listing, --no-special, and the one-line error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/fixtures.h"

namespace hyspec {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

// Runs the hyspec binary with exact argv (no shell), capturing stdout and stderr.
RunResult run_hyspec(const std::vector<std::string>& args) {
  const std::string out_path = testing::TempDir() + "hyspec_tokenize_out_" + std::to_string(getpid());
  const std::string err_path = testing::TempDir() + "hyspec_tokenize_err_" + std::to_string(getpid());
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    const std::string bin = test::hyspec_binary();
    std::vector<char*> argv = {const_cast<char*>(bin.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  RunResult r;
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = test::read_text_file(out_path);
  r.err = test::read_text_file(err_path);
  return r;
}

// Case `index` of the llama.cpp vocab test data: the input and its expected .out line.
std::pair<std::string, std::string> vocab_case(size_t index) {
  const std::string inp = test::read_text_file(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  for (size_t i = 0; i < index; ++i) pos = inp.find(sep, pos) + sep.size();
  const std::string text = inp.substr(pos, inp.find(sep, pos) - pos);
  std::istringstream out(test::read_text_file(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.out")));
  std::string line;
  for (size_t i = 0; i <= index; ++i) std::getline(out, line);
  return {text, line};
}

TEST(CliTokenize, IdsMatchTheLlamaCppVocabTestLine) {
  const std::string vocab = test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf");
  // 32: "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～"; 18: " this is 🦙.cpp"; 22: emoji.
  for (size_t index : {32u, 18u, 22u}) {
    const auto [text, expected] = vocab_case(index);
    const RunResult r = run_hyspec({"tokenize", vocab, text, "--ids"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, expected + "\n") << "case " << index << ": " << text;
  }
}

TEST(CliTokenize, ListsEachTokenWithEscapedPieceAndCount) {
  const RunResult r =
      run_hyspec({"tokenize", test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf"), " this is 🦙\n<|im_end|>"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "419  ' this'\n"
            "374  ' is'\n"
            "11162  ' \\xf0\\x9f'\n"
            "99  '\\xa6'\n"
            "247  '\\x99'\n"
            "198  '\\n'\n"
            "151645  '<|im_end|>'\n"
            "7 tokens\n");
}

TEST(CliTokenize, NoSpecialReadsMarkersAsPlainText) {
  const std::string vocab = test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf");
  EXPECT_EQ(run_hyspec({"tokenize", vocab, "<|im_end|>", "--ids"}).out, "151645\n");
  const RunResult plain = run_hyspec({"tokenize", "--no-special", vocab, "<|im_end|>", "--ids"});
  EXPECT_EQ(plain.exit_code, 0);
  EXPECT_NE(plain.out, "151645\n");
  EXPECT_EQ(plain.out.find("151645"), std::string::npos);
}

TEST(CliTokenize, MissingFileIsOneErrorLineAndExitCodeOne) {
  const RunResult r = run_hyspec({"tokenize", "/nonexistent/model.gguf", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(CliTokenize, GgufWithoutVocabularyIsAnError) {
  // A valid GGUF with no metadata at all.
  const std::string path = testing::TempDir() + "no_vocab_" + std::to_string(getpid()) + ".gguf";
  {
    std::string bytes = "GGUF";
    const uint32_t version = 3;
    const uint64_t n_tensors = 0, n_kv = 0;
    bytes.append(reinterpret_cast<const char*>(&version), 4);
    bytes.append(reinterpret_cast<const char*>(&n_tensors), 8);
    bytes.append(reinterpret_cast<const char*>(&n_kv), 8);
    FILE* f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }
  const RunResult r = run_hyspec({"tokenize", path, "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: " + path + ": missing metadata key 'tokenizer.ggml.model'\n");
}

}  // namespace
}  // namespace hyspec
