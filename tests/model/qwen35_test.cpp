// The Qwen3.5 forward against transformers' logits (fixtures made by transformers + llama.cpp's converter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "common/backend_io.h"
#include "common/fixtures.h"
#include "model/hparams.h"
#include "model/qwen35.h"
#include "util/half.h"

namespace hyspec {
namespace {

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen35Model> model;
};

Loaded load(const std::string& rel, bool dequant = false, bool exact = false) {
  Loaded l;
  auto f = GgufFile::open(test::fixture_path(rel));
  EXPECT_TRUE(f.is_ok()) << f.message();
  l.file = std::move(f).value();
  BackendOptions bo;
  bo.exact_activations = exact;
  auto be = create_backend(test::test_backend_kind(), bo);
  EXPECT_TRUE(be.is_ok());
  l.backend = std::move(be).value();
  LoadOptions o;
  o.dequantize_to_f32 = dequant;
  auto m = Qwen35Model::load(*l.backend, *l.file, o);
  EXPECT_TRUE(m.is_ok()) << m.message();
  l.model = std::move(m).value();
  return l;
}

// Runs the prompt in steps of `step` tokens (0: one shot), returns the logits of every row. capture:
// steps of several tokens run as a speculative verify does (per-token state captured, then the
// state of the step's last token restored from the capture).
std::vector<float> run_logits(Loaded& l, const std::vector<int32_t>& tokens, int64_t step, bool chunked,
                              GgmlType kv = GgmlType::F32, bool capture = false) {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = l.model->hparams().n_vocab;
  if (step <= 0) step = n;
  EXPECT_TRUE(l.model->reserve(step).is_ok());
  auto st = l.model->create_state(n + 8, capture ? static_cast<int>(step) : 0, kv);
  EXPECT_TRUE(st.is_ok()) << st.message();
  std::vector<float> logits;
  test::BackendArena io(*l.backend);
  const int32_t* tok_dev = io.put(tokens);
  const int32_t* pos_dev = io.positions(n);
  for (int64_t s = 0; s < n; s += step) {
    const int64_t m = std::min(step, n - s);
    ForwardArgs a;
    a.n = m;
    a.tokens = tok_dev + s;
    a.positions = pos_dev + s;
    a.gdn_chunked = chunked;
    a.capture = capture && step > 1;
    a.logits = io.rows(m, V);
    Status r = l.model->forward(a, *st);
    EXPECT_TRUE(r.is_ok()) << r.message();
    if (a.capture) l.model->restore_captured(*st, static_cast<int>(m - 1), static_cast<int>(m));
    const auto part = io.get(a.logits);
    logits.insert(logits.end(), part.begin(), part.end());
  }
  return logits;
}

std::vector<int32_t> ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

void expect_logits_match(const std::vector<float>& got, const std::vector<float>& want, int64_t V, float tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  EXPECT_LE(max_diff, tol) << what;
  if (std::getenv("HYSPEC_TEST_VERBOSE")) std::printf("%s: max |diff| %.3g\n", what.c_str(), max_diff);
  const int64_t rows = static_cast<int64_t>(got.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const auto g = std::max_element(got.begin() + r * V, got.begin() + (r + 1) * V) - (got.begin() + r * V);
    const auto w = std::max_element(want.begin() + r * V, want.begin() + (r + 1) * V) - (want.begin() + r * V);
    EXPECT_EQ(g, w) << what << " argmax differs at row " << r;
  }
}

class Qwen35Fixture : public ::testing::TestWithParam<std::string> {};

// Every KV cache type: F32, then the rounding ones (F16 to 2^-11, BF16 to 2^-8 relative, Q8_0 to half a
// step of max|x|/127 per 32 values), whose logits stay within a tolerance of that order (measured max
// |diff| on the dense fixture: F16 ~6e-4, BF16 ~5e-3, Q8_0 ~1.5e-2), argmax transformers'. Only F32 and
// F16 on the MoE fixture: its random router has near-tied experts, and BF16's rounding flips a top-k
// choice in the longer cases (logits then move by ~0.5; F16's 8x smaller rounding flips none).
TEST_P(Qwen35Fixture, LogitsMatchTransformersForEveryCase) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  const int64_t V = l.model->hparams().n_vocab;
  for (const auto& c : manifest["cases"]) {
    const auto want = test::read_f32_file(test::fixture_path(dir + "/" + c["logits"].get<std::string>()));
    for (const GgmlType kv : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      if (kv != GgmlType::F32 && kv != GgmlType::F16 && l.model->hparams().n_expert > 0) continue;
      const auto got = run_logits(l, ids(c["tokens"]), 0, true, kv);
      expect_logits_match(got, want, V, kv == GgmlType::Q8_0 ? 3e-2f : kv == GgmlType::BF16 ? 1e-2f : 2e-3f,
                          dir + "/" + c["name"].get<std::string>() + " kv " + std::string(ggml_type_name(kv)));
    }
  }
}

TEST_P(Qwen35Fixture, PerLayerHiddenStatesOfTheShortCaseMatchTransformers) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  const auto& c = manifest["cases"][0];
  ASSERT_EQ(c["name"], "short");
  const auto want = test::read_f32_file(test::fixture_path(dir + "/" + c["hidden"].get<std::string>()));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  const auto tokens = ids(c["tokens"]);
  const int64_t n = static_cast<int64_t>(tokens.size()), E = l.model->hparams().n_embd;
  const int L = l.model->hparams().n_layer;
  ASSERT_EQ(want.size(), static_cast<size_t>((L + 1) * n * E));
  ASSERT_TRUE(l.model->reserve(n).is_ok());
  auto st = l.model->create_state(n, 0, GgmlType::F32);
  ASSERT_TRUE(st.is_ok());
  test::BackendArena io(*l.backend);
  ForwardArgs a;
  a.n = n;
  a.tokens = io.put(tokens);
  a.positions = io.positions(n);
  a.gdn_chunked = true;
  for (int i = 0; i < L; ++i) a.taps.push_back(i);  // the input of layer i = transformers' hidden_states[i]
  a.features = io.rows(n, L * E);
  a.final_hidden = io.rows(n, E);  // hidden_states[L]: after the final norm
  ASSERT_TRUE(l.model->forward(a, *st).is_ok());
  const auto features = io.get(a.features), final_hidden = io.get(a.final_hidden);
  for (int layer = 0; layer <= L; ++layer) {
    float diff = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const float got = layer < L ? features[(t * L + layer) * E + e] : final_hidden[t * E + e];
        diff = std::max(diff, std::fabs(got - want[(layer * n + t) * E + e]));
      }
    EXPECT_LE(diff, 1e-3f) << "hidden state " << layer;
  }
}

// The CPU backend runs prompts through its recurrent row kernel (cheaper there); these tests make it
// use the chunked form so that the two forms are compared for real. (The CUDA backend runs every
// chunked step of >= 128 tokens through its chunked kernels anyway.) The two forms round differently,
// hence tolerances, not equality.
struct ForceChunkedForm {
  ForceChunkedForm() { setenv("HYSPEC_CPU_GDN_CHUNKED", "1", 1); }
  ~ForceChunkedForm() { unsetenv("HYSPEC_CPU_GDN_CHUNKED"); }
};

TEST_P(Qwen35Fixture, RecurrentCaptureHoldsTheStateTheChunkedFormReachesAtEveryPosition) {
  ForceChunkedForm chunked_form;
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  const Qwen35Hparams& hp = l.model->hparams();
  const int64_t ssm = int64_t{hp.ssm_v_heads} * hp.ssm_d * hp.ssm_d, conv = int64_t{hp.conv_kernel - 1} * hp.gdn_channels();
  const auto tokens = ids(manifest["cases"][1]["tokens"]);  // chunk_cross: 70 tokens, past one 64-token chunk
  const int64_t n = static_cast<int64_t>(tokens.size());
  ASSERT_GT(n, 64);
  test::BackendArena io(*l.backend);
  const int32_t* tok_dev = io.put(tokens);
  const int32_t* pos_dev = io.positions(n);
  ASSERT_TRUE(l.model->reserve(n).is_ok());
  // Recurrent form over all tokens, capturing every position's state.
  auto rec = l.model->create_state(n, static_cast<int>(n), GgmlType::F32);
  ASSERT_TRUE(rec.is_ok());
  ForwardArgs a;
  a.n = n;
  a.tokens = tok_dev;
  a.positions = pos_dev;
  a.capture = true;
  ASSERT_TRUE(l.model->forward(a, *rec).is_ok());
  for (int64_t t : {int64_t{1}, int64_t{5}, int64_t{63}, int64_t{64}, int64_t{65}, n}) {
    // Chunked form over the first t tokens from an empty state.
    auto chk = l.model->create_state(n, 0, GgmlType::F32);
    ASSERT_TRUE(chk.is_ok());
    ForwardArgs b;
    b.n = t;
    b.tokens = tok_dev;
    b.positions = pos_dev;
    b.gdn_chunked = true;
    ASSERT_TRUE(l.model->forward(b, *chk).is_ok());
    for (int layer = 0; layer < hp.n_layer; ++layer) {
      if (!hp.recurrent[layer]) continue;
      std::vector<float> want_s(ssm), got_s(ssm), want_c(conv), got_c(conv);
      l.backend->download(want_s.data(), chk->ssm[layer], ssm * sizeof(float));
      l.backend->download(got_s.data(), rec->ssm_capture[layer] + (t - 1) * ssm, ssm * sizeof(float));
      l.backend->download(want_c.data(), chk->conv[layer], conv * sizeof(float));
      l.backend->download(got_c.data(), rec->conv_capture[layer] + (t - 1) * conv, conv * sizeof(float));
      float ds = 0, dc = 0;
      for (int64_t i = 0; i < ssm; ++i) ds = std::max(ds, std::fabs(want_s[i] - got_s[i]));
      for (int64_t i = 0; i < conv; ++i) dc = std::max(dc, std::fabs(want_c[i] - got_c[i]));
      EXPECT_LE(ds, 1e-4f) << "recurrent state, layer " << layer << ", after " << t << " tokens";
      EXPECT_LE(dc, 1e-5f) << "conv window, layer " << layer << ", after " << t << " tokens";
    }
  }
}

// F16 capture: the same forward (the capture type changes only what is stored), and a rollback to
// slot t restores exactly the f16 rounding of the state the F32 capture holds there.
TEST_P(Qwen35Fixture, F16CaptureRestoresTheRoundedF32State) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  const Qwen35Hparams& hp = l.model->hparams();
  const int64_t ssm = int64_t{hp.ssm_v_heads} * hp.ssm_d * hp.ssm_d, V = hp.n_vocab;
  auto tokens = ids(manifest["cases"][1]["tokens"]);
  tokens.resize(17);  // a 16-draft verify step
  const int64_t n = 17;
  test::BackendArena io(*l.backend);
  const int32_t* tok_dev = io.put(tokens);
  const int32_t* pos_dev = io.positions(n);
  ASSERT_TRUE(l.model->reserve(n).is_ok());
  auto s32 = l.model->create_state(n, static_cast<int>(n), GgmlType::F32, StateCapture::F32);
  auto s16 = l.model->create_state(n, static_cast<int>(n), GgmlType::F32, StateCapture::F16);
  ASSERT_TRUE(s32.is_ok() && s16.is_ok());
  float* logits = io.alloc<float>(static_cast<size_t>(n * V));
  std::vector<float> lg32(n * V), lg16(n * V);
  for (auto* st : {&*s32, &*s16}) {
    ForwardArgs a;
    a.n = n;
    a.tokens = tok_dev;
    a.positions = pos_dev;
    a.capture = true;
    a.logits = Rows(logits, n, V);
    ASSERT_TRUE(l.model->forward(a, *st).is_ok());
    l.backend->download((st == &*s32 ? lg32 : lg16).data(), logits, n * V * sizeof(float));
  }
  EXPECT_EQ(lg32, lg16);
  for (int slot : {0, 7, 15}) {
    l.model->restore_captured(*s16, slot, static_cast<int>(n));
    for (int layer = 0; layer < hp.n_layer; ++layer) {
      if (!hp.recurrent[layer]) continue;
      std::vector<float> want(ssm), got(ssm);
      l.backend->download(want.data(), s32->ssm_capture[layer] + slot * ssm, ssm * sizeof(float));
      l.backend->download(got.data(), s16->ssm[layer], ssm * sizeof(float));
      for (int64_t i = 0; i < ssm; ++i)
        ASSERT_EQ(got[i], fp16_to_fp32(fp32_to_fp16(want[i]))) << "layer " << layer << " slot " << slot << " at " << i;
    }
  }
}

// Updates capture: the same forward, the state untouched by it, and a rollback to slot t (one per
// verify, on a fresh verify each) leaves exactly the state and conv window the F32 capture holds there.
TEST_P(Qwen35Fixture, UpdatesCaptureReplaysTheF32CapturedState) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  const Qwen35Hparams& hp = l.model->hparams();
  const int64_t ssm = int64_t{hp.ssm_v_heads} * hp.ssm_d * hp.ssm_d, V = hp.n_vocab;
  const int64_t conv = int64_t{hp.conv_kernel - 1} * hp.gdn_channels();
  auto tokens = ids(manifest["cases"][1]["tokens"]);
  tokens.resize(21);
  const int64_t n0 = 4, n = 17;  // a 4-token prefix, then a 16-draft verify step
  test::BackendArena io(*l.backend);
  const int32_t* tok_dev = io.put(tokens);
  const int32_t* pos_dev = io.positions(n0 + n);
  ASSERT_TRUE(l.model->reserve(n).is_ok());
  float* logits = io.alloc<float>(static_cast<size_t>(n * V));
  auto run = [&](SequenceState& st, std::vector<float>* lg) {
    ForwardArgs a;
    a.n = n0;
    a.tokens = tok_dev;
    a.positions = pos_dev;
    ASSERT_TRUE(l.model->forward(a, st).is_ok());
    a.n = n;
    a.tokens = tok_dev + n0;
    a.positions = pos_dev + n0;
    a.capture = true;
    a.logits = Rows(logits, n, V);
    ASSERT_TRUE(l.model->forward(a, st).is_ok());
    if (lg) {
      lg->resize(n * V);
      l.backend->download(lg->data(), logits, n * V * sizeof(float));
    }
  };
  auto s32 = l.model->create_state(n0 + n, static_cast<int>(n), GgmlType::F32, StateCapture::F32);
  ASSERT_TRUE(s32.is_ok());
  std::vector<float> lg32, lgu;
  run(*s32, &lg32);
  for (int slot : {0, 7, 16}) {
    auto su = l.model->create_state(n0 + n, static_cast<int>(n), GgmlType::F32, StateCapture::Updates);
    ASSERT_TRUE(su.is_ok());
    auto before = l.model->create_state(n0 + n, 0, GgmlType::F32);  // the prefix's state
    ASSERT_TRUE(before.is_ok());
    ForwardArgs a;
    a.n = n0;
    a.tokens = tok_dev;
    a.positions = pos_dev;
    ASSERT_TRUE(l.model->forward(a, *before).is_ok());
    run(*su, &lgu);
    EXPECT_EQ(lgu, lg32) << "slot " << slot;
    for (int layer = 0; layer < hp.n_layer; ++layer) {
      if (!hp.recurrent[layer]) continue;
      std::vector<float> want(ssm), got(ssm);
      l.backend->download(want.data(), before->ssm[layer], ssm * sizeof(float));
      l.backend->download(got.data(), su->ssm[layer], ssm * sizeof(float));
      ASSERT_EQ(got, want) << "the verify left layer " << layer << "'s state as it was";
    }
    l.model->restore_captured(*su, slot, static_cast<int>(n));
    for (int layer = 0; layer < hp.n_layer; ++layer) {
      if (!hp.recurrent[layer]) continue;
      std::vector<float> want(ssm), got(ssm), want_c(conv), got_c(conv);
      l.backend->download(want.data(), s32->ssm_capture[layer] + slot * ssm, ssm * sizeof(float));
      l.backend->download(got.data(), su->ssm[layer], ssm * sizeof(float));
      l.backend->download(want_c.data(), s32->conv_capture[layer] + slot * conv, conv * sizeof(float));
      l.backend->download(got_c.data(), su->conv[layer], conv * sizeof(float));
      for (int64_t i = 0; i < ssm; ++i)
        ASSERT_EQ(got[i], want[i]) << "layer " << layer << " slot " << slot << " at " << i;
      EXPECT_EQ(got_c, want_c) << "conv window, layer " << layer << " slot " << slot;
    }
  }
}

TEST_P(Qwen35Fixture, RecurrentFormEqualsChunkedForm) {
  ForceChunkedForm chunked_form;
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  for (const auto& c : manifest["cases"]) {
    const auto tokens = ids(c["tokens"]);
    const auto chunked = run_logits(l, tokens, 0, true);
    const auto recurrent = run_logits(l, tokens, 0, false);
    float max_diff = 0;
    for (size_t i = 0; i < chunked.size(); ++i) max_diff = std::max(max_diff, std::fabs(chunked[i] - recurrent[i]));
    EXPECT_LE(max_diff, 1e-4f) << c["name"];
  }
}

TEST_P(Qwen35Fixture, PrefillThenDecodeEqualsOneShotPrefillAcrossTheChunkBoundary) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded l = load(dir + "/" + dir + "-f32.gguf");
  for (const auto& c : manifest["cases"]) {
    const auto tokens = ids(c["tokens"]);
    if (tokens.size() < 66) continue;
    const auto one_shot = run_logits(l, tokens, 0, true);
    const auto stepped = run_logits(l, tokens, 1, false);   // pure decode
    const auto mixed = run_logits(l, tokens, 60, true);     // prompt chunks of 60 cross the 64 boundary
    float d1 = 0, d2 = 0;
    for (size_t i = 0; i < one_shot.size(); ++i) {
      d1 = std::max(d1, std::fabs(one_shot[i] - stepped[i]));
      d2 = std::max(d2, std::fabs(one_shot[i] - mixed[i]));
    }
    EXPECT_LE(d1, 1e-4f) << c["name"];
    EXPECT_LE(d2, 1e-4f) << c["name"];
  }
}

TEST_P(Qwen35Fixture, QuantizedKernelsComputeWhatTheDequantizedWeightsSay) {
  if (test::test_backend_kind() != BackendKind::Cpu)
    GTEST_SKIP() << "CPU activation modes; CUDA's quantized kernels are checked by qwen35_cuda_test";
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  // Exact activations: the fast path quantizes activations to int8 blocks (as llama.cpp does), whose
  // rounding these random, chaotic models amplify to ~0.5 in the logits; with f32 activations the
  // quantized kernels must give what the dequantized weights give.
  Loaded q = load(dir + "/" + dir + "-q8_0.gguf", false, true);
  Loaded d = load(dir + "/" + dir + "-q8_0.gguf", true);
  const int64_t V = q.model->hparams().n_vocab;
  for (const auto& c : manifest["cases"]) {
    const auto tokens = ids(c["tokens"]);
    const auto a = run_logits(q, tokens, 0, true);
    const auto b = run_logits(d, tokens, 0, true);
    float max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    EXPECT_LE(max_diff, 1e-3f) << c["name"];
    (void)V;
  }
}

TEST_P(Qwen35Fixture, QuantizedActivationFastPathStaysCloseToTheExactPath) {
  if (test::test_backend_kind() != BackendKind::Cpu)
    GTEST_SKIP() << "CPU activation modes; CUDA's quantized kernels are checked by qwen35_cuda_test";
  const std::string dir = GetParam();
  // MoE routing turns a small difference into a different expert, which no norm bound describes.
  if (dir == "qwen35moe-tiny") GTEST_SKIP() << "dense model only";
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  Loaded fast = load(dir + "/" + dir + "-q8_0.gguf");
  Loaded exact = load(dir + "/" + dir + "-q8_0.gguf", false, true);
  for (const auto& c : manifest["cases"]) {
    const auto tokens = ids(c["tokens"]);
    const auto a = run_logits(fast, tokens, 0, true);
    const auto b = run_logits(exact, tokens, 0, true);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * double(a[i] - b[i]);
      den += double(b[i]) * b[i];
    }
    const double rel = std::sqrt(num / den);
    if (std::getenv("HYSPEC_TEST_VERBOSE")) std::printf("%s: relative difference %.3g\n", c["name"].get<std::string>().c_str(), rel);
    // int8 activation blocks carry ~0.4% rounding per value; these random models amplify it through
    // 8 layers to 7-10% of the logits' norm (measured); a broken kernel gives O(1).
    EXPECT_LT(rel, 0.15) << c["name"];
  }
}

// Speculative decoding is lossless only if a verify step computes each row exactly as a decode step
// would: any batch-width-dependent rounding flips near-tied argmaxes. So every row of a recurrent
// (verify-form) step of width w, with capture on, must be bit-identical to one-token steps.
std::vector<float> run_verify_form(Loaded& l, const std::vector<int32_t>& tokens, int64_t width,
                                   GgmlType kv = GgmlType::F16) {
  return run_logits(l, tokens, width, /*chunked=*/false, kv, /*capture=*/true);
}

TEST_P(Qwen35Fixture, VerifyRowsAreBitIdenticalToDecodeSteps) {
  const std::string dir = GetParam();
  // Verify widths: up to 33 on the CPU; on CUDA the verify range of the matvec (n <= 32; wider
  // steps are prompt chunks, which take the GEMM path and need not match a decode step).
  std::vector<int64_t> widths = {2, 3, 5, 8, 16, 17, 32};
  if (test::test_backend_kind() == BackendKind::Cpu) widths.push_back(33);
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  // F16 KV on both weight files, BF16 and Q8_0 KV (their own attention paths on CUDA) on the f32 one.
  for (const auto& [type, kv] : {std::pair{"f32", GgmlType::F16}, std::pair{"q8_0", GgmlType::F16},
                                 std::pair{"f32", GgmlType::BF16}, std::pair{"f32", GgmlType::Q8_0}}) {
    Loaded l = load(dir + "/" + dir + "-" + type + ".gguf");
    for (const auto& c : manifest["cases"]) {
      const auto tokens = ids(c["tokens"]);
      const auto decode = run_verify_form(l, tokens, 1, kv);
      for (int64_t width : widths) {
        const auto verify = run_verify_form(l, tokens, width, kv);
        ASSERT_EQ(decode.size(), verify.size());
        size_t first = decode.size();
        for (size_t i = 0; i < decode.size() && first == decode.size(); ++i)
          if (std::memcmp(&decode[i], &verify[i], sizeof(float)) != 0) first = i;
        EXPECT_EQ(first, decode.size()) << type << " kv " << ggml_type_name(kv) << " " << c["name"] << " width "
                                        << width << ": first differing logit " << first << " (row "
                                        << first / l.model->hparams().n_vocab << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen35Fixture, ::testing::Values("qwen35-tiny", "qwen35moe-tiny"));

// The weight bytes a one-token step reads (hyspec info, hyspec bench's GB/s column): the trunk's
// tensors and the output head, counted here from the positive list of what a step runs, plus one
// row of the token embedding; the MTP block apart; MoE expert tensors at top-k / experts.
TEST(DecodeWeightBytes, TrunkHeadAndOneEmbeddingRowWithExpertsAtTheRoutedShare) {
  for (const char* rel : {"qwen35-tiny/qwen35-tiny-f32.gguf", "qwen35moe-tiny/qwen35moe-tiny-q8_0.gguf"}) {
    auto f = GgufFile::open(test::fixture_path(rel));
    ASSERT_TRUE(f.is_ok()) << f.message();
    auto hp = read_qwen35_hparams(**f);
    ASSERT_TRUE(hp.is_ok()) << hp.message();
    ASSERT_GT(hp->n_nextn, 0) << rel << ": the fixture should have an MTP block, for the exclusion to show";
    uint64_t target = 0, mtp = 0, experts = 0;
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      const bool expert = t.name.find("_exps.") != std::string::npos;
      const uint64_t bytes = expert ? t.nbytes / hp->n_expert * hp->n_expert_used : t.nbytes;
      if (expert) experts += t.nbytes;
      bool trunk = t.name == "output.weight" || t.name == "output_norm.weight";
      for (int i = 0; i < hp->n_layer && !trunk; ++i) trunk = t.name.rfind(fmt::format("blk.{}.", i), 0) == 0;
      if (trunk) target += bytes;
      if (t.name == "token_embd.weight") target += t.nbytes / static_cast<uint64_t>(t.ne[1]);  // one row
      if (t.name.rfind(fmt::format("blk.{}.", hp->n_layer), 0) == 0) mtp += bytes;
    }
    EXPECT_GT(mtp, 0u) << rel;
    EXPECT_EQ(experts > 0, hp->moe) << rel;
    const DecodeWeightBytes d = decode_weight_bytes(**f, hp->n_layer, hp->n_expert, hp->n_expert_used);
    EXPECT_EQ(d.target, target) << rel;
    EXPECT_EQ(d.nextn, mtp) << rel;
  }
}

}  // namespace
}  // namespace hyspec
