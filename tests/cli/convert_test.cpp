// `hyspec convert` against llama.cpp's convert_hf_to_gguf.py (the fixture GGUFs):
//  - the dflash-tiny HF directory converts to dflash-tiny-f32.gguf, key by key and tensor by tensor;
//  - the fixtures hold no HF checkpoint of the Qwen3.5 target, so one is rebuilt here from
//    qwen35-tiny-f32.gguf by undoing each convention as QWEN35.md states it (an inverse written from
//    the spec, not from the converter), converted back, and compared with the fixture; the same
//    checkpoint converted with --type q8_0 must match llama.cpp's q8_0 file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/fixtures.h"
#include "common/process.h"
#include "format/gguf.h"
#include "util/half.h"

namespace hyspec {
namespace {

namespace fs = std::filesystem;

test::CommandResult run_hyspec(const std::string& args) {
  return test::run_command("'" + test::hyspec_binary() + "' " + args);
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hyspec_convert_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// ---- comparison ------------------------------------------------------------------------------

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufValueType::STRING: return a.str == b.str;
    case GgufValueType::ARRAY:
      if (a.elem_type != b.elem_type || a.array.size() != b.array.size()) return false;
      for (size_t i = 0; i < a.array.size(); ++i)
        if (!same_value(a.array[i], b.array[i])) return false;
      return true;
    case GgufValueType::FLOAT32:
    case GgufValueType::FLOAT64: return a.scalar.f == b.scalar.f;
    default: return a.scalar.u == b.scalar.u;
  }
}

// Every key (in order, with type and value) and every tensor (in order, type, shape, bytes) of
// `expected` is in `actual` and nothing else. Tensors named in `approx` are F32 and compared within
// a relative 1e-6 (their round trip through the test's inverse is not exact).
void expect_same_gguf(const std::string& actual_path, const std::string& expected_path,
                      const std::set<std::string>& approx = {}) {
  auto actual = GgufFile::open(actual_path);
  auto expected = GgufFile::open(expected_path);
  ASSERT_TRUE(actual.is_ok()) << actual.message();
  ASSERT_TRUE(expected.is_ok()) << expected.message();
  const auto& ka = (*actual)->metadata();
  const auto& ke = (*expected)->metadata();
  ASSERT_EQ(ka.size(), ke.size()) << "metadata key count";
  for (size_t i = 0; i < ke.size(); ++i) {
    EXPECT_EQ(ka[i].first, ke[i].first) << "key " << i;
    EXPECT_TRUE(same_value(ka[i].second, ke[i].second)) << "value of " << ke[i].first;
  }
  const auto& ta = (*actual)->tensors();
  const auto& te = (*expected)->tensors();
  ASSERT_EQ(ta.size(), te.size()) << "tensor count";
  for (size_t i = 0; i < te.size(); ++i) {
    const GgufTensorInfo& a = ta[i];
    const GgufTensorInfo& e = te[i];
    EXPECT_EQ(a.name, e.name) << "tensor " << i;
    EXPECT_EQ(a.type, e.type) << e.name;
    EXPECT_EQ(a.shape_string(), e.shape_string()) << e.name;
    if (a.nbytes != e.nbytes || a.type != e.type) {
      ADD_FAILURE() << e.name << ": " << a.nbytes << " bytes, expected " << e.nbytes;
      continue;
    }
    if (approx.count(e.name)) {
      ASSERT_EQ(e.type, GgmlType::F32) << e.name;
      const auto* x = reinterpret_cast<const float*>(a.data);
      const auto* y = reinterpret_cast<const float*>(e.data);
      for (int64_t k = 0; k < e.n_elements(); ++k)
        EXPECT_NEAR(x[k], y[k], 1e-6 * std::fabs(y[k])) << e.name << "[" << k << "]";
    } else {
      EXPECT_EQ(std::memcmp(a.data, e.data, e.nbytes), 0) << e.name << ": bytes differ";
    }
  }
}

// ---- the Qwen3.5 inverse: GGUF -> HF, from QWEN35.md -------------------------------------------

struct HfTensor {
  std::vector<int64_t> shape;  // row-major, HF order
  std::vector<float> data;
};

// GGUF stores the v-heads tiled (v-head g uses k-head g mod Hk); HF groups them by k-head (v-head h
// uses k-head h / r, r = Hv / Hk). The m-th v-head of k-head j is HF head j*r + m and GGUF head
// m*Hk + j. Along rows a head is `head_values` contiguous values from offset row0; along columns
// it is `head_cols` values inside every row.
std::vector<float> grouped_rows(const std::vector<float>& g, int64_t row0, int64_t head_values, int hk, int hv) {
  std::vector<float> h = g;
  const int r = hv / hk;
  for (int j = 0; j < hk; ++j)
    for (int m = 0; m < r; ++m)
      std::memcpy(&h[row0 + (j * r + m) * head_values], &g[row0 + (m * hk + j) * head_values],
                  head_values * sizeof(float));
  return h;
}

std::vector<float> grouped_cols(const std::vector<float>& g, int64_t rows, int64_t head_cols, int hk, int hv) {
  std::vector<float> h = g;
  const int r = hv / hk;
  const int64_t row_len = hv * head_cols;
  for (int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < hk; ++j)
      for (int m = 0; m < r; ++m)
        std::memcpy(&h[i * row_len + (j * r + m) * head_cols], &g[i * row_len + (m * hk + j) * head_cols],
                    head_cols * sizeof(float));
  return h;
}

// The HF checkpoint llama.cpp converted into qwen35-tiny-f32.gguf, recovered from that file.
std::map<std::string, HfTensor> qwen35_hf_from_gguf(const GgufFile& f) {
  const int n_layer = static_cast<int>(*f.get_int("qwen35.block_count") - *f.get_int("qwen35.nextn_predict_layers"));
  const int hk = static_cast<int>(*f.get_int("qwen35.ssm.group_count"));
  const int hv = static_cast<int>(*f.get_int("qwen35.ssm.time_step_rank"));
  const int64_t d = *f.get_int("qwen35.ssm.state_size");
  const int64_t dv = *f.get_int("qwen35.ssm.inner_size") / hv;
  const int64_t K = hk * d;
  // GGUF block suffix -> HF name relative to the layer, and whether HF stores the norm as w - 1.
  const std::map<std::string, std::pair<std::string, bool>> layer = {
      {"attn_norm.weight", {"input_layernorm.weight", true}},
      {"post_attention_norm.weight", {"post_attention_layernorm.weight", true}},
      {"ffn_gate.weight", {"mlp.gate_proj.weight", false}},
      {"ffn_up.weight", {"mlp.up_proj.weight", false}},
      {"ffn_down.weight", {"mlp.down_proj.weight", false}},
      {"attn_q.weight", {"self_attn.q_proj.weight", false}},
      {"attn_k.weight", {"self_attn.k_proj.weight", false}},
      {"attn_v.weight", {"self_attn.v_proj.weight", false}},
      {"attn_output.weight", {"self_attn.o_proj.weight", false}},
      {"attn_q_norm.weight", {"self_attn.q_norm.weight", true}},
      {"attn_k_norm.weight", {"self_attn.k_norm.weight", true}},
      {"attn_qkv.weight", {"linear_attn.in_proj_qkv.weight", false}},
      {"attn_gate.weight", {"linear_attn.in_proj_z.weight", false}},
      {"ssm_beta.weight", {"linear_attn.in_proj_b.weight", false}},
      {"ssm_alpha.weight", {"linear_attn.in_proj_a.weight", false}},
      {"ssm_conv1d.weight", {"linear_attn.conv1d.weight", false}},
      {"ssm_dt.bias", {"linear_attn.dt_bias", false}},
      {"ssm_a", {"linear_attn.A_log", false}},
      {"ssm_norm.weight", {"linear_attn.norm.weight", false}},  // the gated norm: weight as is
      {"ssm_out.weight", {"linear_attn.out_proj.weight", false}},
      {"nextn.eh_proj.weight", {"mtp.fc.weight", false}},
      {"nextn.enorm.weight", {"mtp.pre_fc_norm_embedding.weight", true}},
      {"nextn.hnorm.weight", {"mtp.pre_fc_norm_hidden.weight", true}},
      {"nextn.shared_head_norm.weight", {"mtp.norm.weight", true}},
  };
  std::map<std::string, HfTensor> hf;
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    HfTensor h;
    for (int i = t.n_dims - 1; i >= 0; --i) h.shape.push_back(t.ne[i]);
    const auto* p = reinterpret_cast<const float*>(t.data);
    h.data.assign(p, p + t.n_elements());
    std::string name;
    bool minus_one = false;
    if (t.name == "token_embd.weight") {
      name = "model.embed_tokens.weight";
    } else if (t.name == "output.weight") {
      name = "lm_head.weight";
    } else if (t.name == "output_norm.weight") {
      name = "model.norm.weight", minus_one = true;
    } else {
      const size_t dot = t.name.find('.', 4);
      const int bid = std::stoi(t.name.substr(4, dot - 4));
      const std::string suffix = t.name.substr(dot + 1);
      auto it = layer.find(suffix);
      if (it == layer.end()) {
        ADD_FAILURE() << "no HF name for " << t.name;
        continue;
      }
      minus_one = it->second.second;
      if (suffix.rfind("nextn.", 0) == 0)
        name = it->second.first;
      else if (bid >= n_layer)
        name = "mtp.layers." + std::to_string(bid - n_layer) + "." + it->second.first;
      else
        name = "model.layers." + std::to_string(bid) + "." + it->second.first;
      if (suffix == "attn_qkv.weight") {
        h.data = grouped_rows(h.data, 2 * K * h.shape[1], dv * h.shape[1], hk, hv);
      } else if (suffix == "attn_gate.weight") {
        h.data = grouped_rows(h.data, 0, dv * h.shape[1], hk, hv);
      } else if (suffix == "ssm_beta.weight" || suffix == "ssm_alpha.weight") {
        h.data = grouped_rows(h.data, 0, h.shape[1], hk, hv);
      } else if (suffix == "ssm_conv1d.weight") {  // GGUF [K, C] is HF [C, 1, K]
        h.data = grouped_rows(h.data, 2 * K * h.shape[1], dv * h.shape[1], hk, hv);
        h.shape = {h.shape[0], 1, h.shape[1]};
      } else if (suffix == "ssm_dt.bias") {
        h.data = grouped_rows(h.data, 0, 1, hk, hv);
      } else if (suffix == "ssm_a") {  // ssm_a = -exp(A_log)
        h.data = grouped_rows(h.data, 0, 1, hk, hv);
        for (float& v : h.data) v = std::log(-v);
      } else if (suffix == "ssm_out.weight") {
        h.data = grouped_cols(h.data, h.shape[0], dv, hk, hv);
      }
    }
    if (minus_one)
      for (float& v : h.data) v -= 1.0f;
    hf[name] = std::move(h);
  }
  return hf;
}

void write_safetensors(const fs::path& path, const std::map<std::string, HfTensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size() * 4}}};
    offset += t.data.size() * 4;
  }
  const std::string h = header.dump();
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
}

// The tokenizer files of the fixtures' HF directory: tokenizer.json, config.json and the
// tokenizer_config.json Qwen ships (EOS <|im_end|>, padding <|endoftext|>, no BOS).
void write_tokenizer_dir(const fs::path& dir) {
  fs::create_directories(dir);
  fs::copy_file(test::fixture_path("qwen35-tiny/tokenizer.json"), dir / "tokenizer.json");
  fs::copy_file(test::fixture_path("qwen35-tiny/hf_config.json"), dir / "config.json");
  write_text(dir / "tokenizer_config.json",
             R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})");
}

TEST(Convert, DflashDirectoryMatchesLlamaCppGguf) {
  TempDir tmp;
  write_tokenizer_dir(tmp.path / "target");
  const std::string out = (tmp.path / "dflash.gguf").string();
  const test::CommandResult r = run_hyspec("convert '" + test::fixture_path("dflash-tiny/hf") + "' '" + out +
                                 "' --tokenizer '" + (tmp.path / "target").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_gguf(out, test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf"));
}

TEST(Convert, Qwen35RoundTripMatchesLlamaCppGguf) {
  TempDir tmp;
  const std::string fixture = test::fixture_path("qwen35-tiny/qwen35-tiny-f32.gguf");
  auto f = GgufFile::open(fixture);
  ASSERT_TRUE(f.is_ok()) << f.message();
  const fs::path hf = tmp.path / "hf";  // general.name comes from the directory: "Hf", as in the fixture
  write_tokenizer_dir(hf);
  write_safetensors(hf / "model.safetensors", qwen35_hf_from_gguf(**f));

  std::set<std::string> approx;  // -exp(log(-a)) is not bit-exact
  for (const GgufTensorInfo& t : (*f)->tensors())
    if (t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".ssm_a") == 0) approx.insert(t.name);
  const std::string out = (tmp.path / "f32.gguf").string();
  test::CommandResult r = run_hyspec("convert '" + hf.string() + "' '" + out + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_gguf(out, fixture, approx);

  const std::string q8 = (tmp.path / "q8_0.gguf").string();
  r = run_hyspec("convert '" + hf.string() + "' '" + q8 + "' --type q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_gguf(q8, test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf"), approx);
}

// --type f16 / bf16 (no llama.cpp file to compare with): matrices take the type, rounded to nearest
// even; norms, 1-D tensors, ssm_a / ssm_dt.bias and ssm_conv1d stay F32, as llama.cpp keeps them.
TEST(Convert, HalfTypesConvertMatricesAndKeepTheRestF32) {
  TempDir tmp;
  const std::string fixture = test::fixture_path("qwen35-tiny/qwen35-tiny-f32.gguf");
  auto f = GgufFile::open(fixture);
  ASSERT_TRUE(f.is_ok()) << f.message();
  const fs::path hf = tmp.path / "hf";
  write_tokenizer_dir(hf);
  write_safetensors(hf / "model.safetensors", qwen35_hf_from_gguf(**f));
  for (const auto& [flag, type, gguf_file_type] :
       {std::tuple{"f16", GgmlType::F16, 1}, std::tuple{"bf16", GgmlType::BF16, 32}}) {
    const std::string out = (tmp.path / (std::string(flag) + ".gguf")).string();
    const test::CommandResult r = run_hyspec("convert '" + hf.string() + "' '" + out + "' --type " + flag);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto g = GgufFile::open(out);
    ASSERT_TRUE(g.is_ok()) << g.message();
    EXPECT_EQ(*(*g)->get_int("general.file_type"), gguf_file_type);
    ASSERT_EQ((*g)->tensors().size(), (*f)->tensors().size());
    for (const GgufTensorInfo& e : (*f)->tensors()) {
      const GgufTensorInfo* a = (*g)->find_tensor(e.name);
      ASSERT_TRUE(a) << e.name;
      const bool stays_f32 = e.n_dims == 1 || e.name.ends_with("_norm.weight") || !e.name.ends_with(".weight") ||
                             e.name.find("ssm_conv1d") != std::string::npos;
      EXPECT_EQ(a->type, stays_f32 ? GgmlType::F32 : type) << flag << " " << e.name;
      if (stays_f32) continue;
      const auto* want = reinterpret_cast<const float*>(e.data);
      const auto* got = reinterpret_cast<const uint16_t*>(a->data);
      for (int64_t k = 0; k < e.n_elements(); ++k) {
        const uint16_t expect = type == GgmlType::F16 ? fp32_to_fp16(want[k]) : fp32_to_bf16(want[k]);
        ASSERT_EQ(got[k], expect) << flag << " " << e.name << "[" << k << "]";
      }
    }
  }
}

TEST(Convert, ErrorsNameTheProblem) {
  TempDir tmp;
  test::CommandResult r = run_hyspec("convert '" + tmp.path.string() + "' '" + (tmp.path / "x.gguf").string() + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
  // A DFlash drafter needs its target's tokenizer.
  r = run_hyspec("convert '" + test::fixture_path("dflash-tiny/hf") + "' '" + (tmp.path / "x.gguf").string() + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--tokenizer"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.path / "x.gguf"));
}

}  // namespace
}  // namespace hyspec
