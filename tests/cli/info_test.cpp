// `hyspec info` run as a user would: key lines for each fixture kind, and a one-line error with
// exit code 1 for a damaged file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "common/fixtures.h"
#include "common/process.h"
#include "format/gguf.h"

namespace hyspec {
namespace {

using RunResult = test::CommandResult;

RunResult run_info(const std::string& path) {
  return test::run_command("'" + test::hyspec_binary() + "' info '" + path + "'");
}

bool has_line(const std::string& out, const std::string& line) {
  return ("\n" + out).find("\n" + line + "\n") != std::string::npos;
}

// A hyperparameter line: the key without the architecture prefix, padding, the value.
bool has_hparam(const std::string& out, const std::string& key, const std::string& value) {
  const std::regex re("(^|\n)  " + std::regex_replace(key, std::regex("\\."), "\\.") + " +" +
                      std::regex_replace(value, std::regex("[\\[\\]]"), "\\$&") + "\n");
  return std::regex_search(out, re);
}

// Oracle for the decode-bytes lines, straight from the tensor list.
struct DecodeBytes {
  uint64_t model = 0, nextn = 0;
};
DecodeBytes decode_bytes(const GgufFile& f, int first_nextn_block, int experts, int used) {
  DecodeBytes d;
  for (const GgufTensorInfo& t : f.tensors()) {
    uint64_t b = t.nbytes;
    if (t.name == "token_embd.weight") b = t.nbytes / static_cast<uint64_t>(t.ne[1]);
    if (t.name.find("_exps.") != std::string::npos) b = b / experts * used;
    if (t.name.rfind("blk." + std::to_string(first_nextn_block) + ".", 0) == 0) d.nextn += b;
    else d.model += b;
  }
  return d;
}

TEST(InfoCli, DescribesTheDenseModel) {
  const std::string path = test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf");
  const RunResult r = run_info(path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "GGUF version: 3")) << r.output;
  EXPECT_TRUE(has_line(r.output, "architecture: qwen35"));
  EXPECT_TRUE(has_line(r.output, "name: Hf"));
  EXPECT_TRUE(has_hparam(r.output, "block_count", "9"));
  EXPECT_TRUE(has_hparam(r.output, "rope.dimension_sections", "[3, 3, 2, 0]"));
  EXPECT_FALSE(has_hparam(r.output, "block_count", "8"));
  EXPECT_TRUE(has_line(r.output, "  model: gpt2"));
  EXPECT_TRUE(has_line(r.output, "  pre: qwen35"));
  EXPECT_TRUE(has_line(r.output, "  vocab size: 512"));
  EXPECT_TRUE(has_line(r.output, "  merges: 251"));
  EXPECT_TRUE(has_line(r.output, "  eos: 509 \"<|im_end|>\""));
  EXPECT_TRUE(has_line(r.output, "  pad: 507 \"<|endoftext|>\""));
  EXPECT_TRUE(has_line(r.output, "tensors: 124"));
  EXPECT_NE(r.output.find("  blk.0.attn_qkv.weight                Q8_0     [128, 256]"), std::string::npos);
  EXPECT_NE(r.output.find("  Q8_0       72 tensors"), std::string::npos);
  EXPECT_NE(r.output.find("  F32        52 tensors"), std::string::npos);
  EXPECT_TRUE(has_line(r.output, "parameters: 2.07 M (2071920)"));
  // K and V of 2 attention layers x 2 kv heads x 64 per token: 2048 B in F32; Q8_0 slots of 64 + 4 -> 80 B
  EXPECT_TRUE(has_line(r.output, "KV cache per 1024 tokens (2 attention layers x 2 kv heads x 64):  F32 2.00 MiB  "
                                 "F16 1.00 MiB  BF16 1.00 MiB  Q8_0 640.00 KiB"))
      << r.output;

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  const DecodeBytes d = decode_bytes(**f, 8, 1, 1);
  EXPECT_NE(r.output.find(fmt::format("  model: {:.2f} MiB ({} B)", d.model / 1048576.0, d.model)), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(fmt::format("  nextn/MTP block: {:.2f} KiB ({} B;", d.nextn / 1024.0, d.nextn)),
            std::string::npos);
}

TEST(InfoCli, CountsOnlyTheUsedExpertsOfTheMoeModel) {
  const std::string path = test::fixture_path("qwen35moe-tiny/qwen35moe-tiny-q8_0.gguf");
  const RunResult r = run_info(path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "architecture: qwen35moe"));
  EXPECT_TRUE(has_hparam(r.output, "expert_count", "8"));
  EXPECT_TRUE(has_hparam(r.output, "expert_used_count", "2"));
  EXPECT_TRUE(has_line(r.output, "tensors: 169"));
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  const DecodeBytes d = decode_bytes(**f, 8, 8, 2);
  EXPECT_NE(r.output.find(fmt::format("({} B)", d.model)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fmt::format("({} B;", d.nextn)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expert tensors at 2/8 experts"), std::string::npos);
}

TEST(InfoCli, DescribesTheDflashDrafter) {
  const RunResult r = run_info(test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "architecture: dflash"));
  EXPECT_TRUE(has_hparam(r.output, "target_layers", "[2, 4, 6]"));
  EXPECT_TRUE(has_line(r.output, "  mask: 507 \"<|endoftext|>\""));
  EXPECT_TRUE(has_line(r.output, "tensors: 25"));
  EXPECT_NE(r.output.find("  F32        25 tensors    1.32 MiB  100.0%"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nextn/MTP"), std::string::npos);
}

TEST(InfoCli, DescribesAVocabularyOnlyFile) {
  const RunResult r = run_info(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "  vocab size: 151936"));
  EXPECT_TRUE(has_line(r.output, "  merges: 151387"));
  EXPECT_TRUE(has_line(r.output, "  control tokens: 3"));
  EXPECT_TRUE(has_line(r.output, "tensors: 0"));
  EXPECT_EQ(r.output.find("quant mix"), std::string::npos);
}

TEST(InfoCli, TruncatedFileIsAOneLineErrorWithExitCode1) {
  const std::string src = test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hyspec_info_test";
  std::filesystem::create_directories(dir);
  const std::string cut = (dir / "truncated.gguf").string();
  {
    std::ifstream in(src, std::ios::binary);
    std::string bytes(1'000'000, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const RunResult r = run_info(cut);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output.rfind("error: " + cut + ": ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("extends past the end of the file"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "more than one line: " << r.output;

  const RunResult missing = run_info((dir / "missing.gguf").string());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.output.rfind("error: ", 0), 0u) << missing.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hyspec
