// The DFlash drafter against llama.cpp's own CPU implementation (dflash-tiny fixtures): the target's
// tapped features, then inject + one non-causal draft block, from the GGUF and from the HF directory.
#include "model/dflash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "backend/backend.h"
#include "common/backend_io.h"
#include "common/fixtures.h"
#include "format/gguf_writer.h"
#include "format/safetensors.h"
#include "model/dflash_reference.h"
#include "model/qwen35.h"

namespace hyspec {
namespace {

const std::string kDir = "dflash-tiny/";
// Exact f32 drafter vs llama.cpp's F16-accumulating CPU attention (see Reference below).
constexpr float kDraftLogitsTolerance = 1e-2f;

struct Target {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen35Model> model;
};

Target load_target() {
  Target t;
  auto f = GgufFile::open(test::fixture_path("qwen35-tiny/qwen35-tiny-f32.gguf"));
  EXPECT_TRUE(f.is_ok()) << f.message();
  t.file = std::move(f).value();
  auto be = create_backend(test::test_backend_kind());
  EXPECT_TRUE(be.is_ok());
  t.backend = std::move(be).value();
  auto m = Qwen35Model::load(*t.backend, *t.file, LoadOptions{});
  EXPECT_TRUE(m.is_ok()) << m.message();
  t.model = std::move(m).value();
  return t;
}

std::unique_ptr<GgufFile> open_drafter_gguf() {
  auto f = GgufFile::open(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  EXPECT_TRUE(f.is_ok()) << f.message();
  return std::move(f).value();
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

int32_t argmax_row(const std::vector<float>& x, int64_t row, int64_t cols) {
  const auto first = x.begin() + row * cols;
  return static_cast<int32_t>(std::max_element(first, first + cols) - first);
}

void report(const std::string& what, float diff) {
  if (std::getenv("HYSPEC_TEST_VERBOSE")) std::printf("%s: max |diff| %.3g\n", what.c_str(), diff);
}

// The target over the prompt with the drafter's taps: features [n, n_features] and the last logits row.
struct Prefill {
  std::vector<float> features, last_logits;
};

Prefill run_target(Target& t, const std::vector<int32_t>& tokens, const std::vector<int>& taps, int64_t n_features) {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = t.model->hparams().n_vocab;
  EXPECT_TRUE(t.model->reserve(n).is_ok());
  auto st = t.model->create_state(n + 16, 0, GgmlType::F32);
  EXPECT_TRUE(st.is_ok()) << st.message();
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
  Prefill p;
  test::BackendArena io(*t.backend);
  ForwardArgs a;
  a.n = n;
  a.tokens = io.put(tokens);
  a.positions = io.put(pos);
  a.gdn_chunked = true;
  a.logits = io.rows(1, V);
  a.features = io.rows(n, n_features);
  a.taps = taps;
  Status s = t.model->forward(a, *st);
  EXPECT_TRUE(s.is_ok()) << s.message();
  p.last_logits = io.get(a.logits);
  p.features = io.get(a.features);
  return p;
}

// inject(features at 0..n-1), then draft [last, mask x (B-1)] at n..n+B-1: logits [B, n_vocab_draft].
std::vector<float> inject_and_draft(DflashModel& d, const std::vector<float>& features, int64_t n, int32_t last) {
  const DflashHparams& hp = d.hparams();
  const int64_t B = hp.block_size, V = d.n_vocab_draft();
  EXPECT_TRUE(d.reserve(std::max(n, B)).is_ok());
  auto st = d.create_state(n + B, GgmlType::F32);
  EXPECT_TRUE(st.is_ok()) << st.message();
  std::vector<int32_t> ctx_pos(n), block(B, hp.mask_token_id), block_pos(B);
  for (int64_t i = 0; i < n; ++i) ctx_pos[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < B; ++i) block_pos[i] = static_cast<int32_t>(n + i);
  block[0] = last;
  test::BackendArena io(d.backend());
  DflashInjectArgs in;
  in.n = n;
  in.features = Rows(io.put(features), n, hp.n_features());
  in.positions = io.put(ctx_pos);
  Status s = d.inject(in, *st);
  EXPECT_TRUE(s.is_ok()) << s.message();
  DflashDraftArgs da;
  da.n = B;
  da.tokens = io.put(block);
  da.positions = io.put(block_pos);
  da.logits = io.rows(B, V);
  s = d.draft(da, *st);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return io.get(da.logits);
}

// Every manifest case: the target's features, then the drafter's block logits and drafts.
void expect_drafts_match_llama_cpp(Target& t, DflashModel& d, const std::string& label) {
  const auto manifest = test::read_json_file(test::fixture_path(kDir + "manifest.json"));
  const DflashHparams& hp = d.hparams();
  for (const auto& c : manifest["cases"]) {
    const std::string what = label + "/" + c["name"].get<std::string>();
    const auto tokens = c["tokens"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(tokens.size());
    ASSERT_EQ(c["target_layers"].get<std::vector<int>>(), hp.target_layers) << what;
    ASSERT_EQ(c["mask"].get<int32_t>(), hp.mask_token_id) << what;

    const Prefill p = run_target(t, tokens, hp.target_layers, hp.n_features());
    const auto want_features = test::read_f32_file(test::fixture_path(kDir + c["features"].get<std::string>()));
    ASSERT_EQ(p.features.size(), want_features.size()) << what;
    const float df = max_abs_diff(p.features, want_features);
    report(what + " features", df);
    EXPECT_LE(df, 2e-3f) << what << " features";
    const int32_t last = c["last_token"].get<int32_t>();
    EXPECT_EQ(argmax_row(p.last_logits, 0, static_cast<int64_t>(p.last_logits.size())), last) << what;

    // Inject llama.cpp's features (not ours) so the drafter is judged on its own error only.
    const auto logits = inject_and_draft(d, want_features, n, last);
    const auto want = test::read_f32_file(test::fixture_path(kDir + c["draft_logits"].get<std::string>()));
    ASSERT_EQ(logits.size(), want.size()) << what;
    const float dl = max_abs_diff(logits, want);
    report(what + " draft logits", dl);
    // llama.cpp accumulates attention in F16 (see Reference): up to 7.3e-3 here; the reference that
    // reproduces its arithmetic lands within 2e-3 of it (ReferenceExplainsLlamaCppToWithin2e3).
    EXPECT_LE(dl, kDraftLogitsTolerance) << what << " draft logits";
    const int64_t V = d.n_vocab_draft();
    const auto drafts = c["drafts"].get<std::vector<int32_t>>();
    for (int64_t r = 0; r < hp.block_size; ++r) {
      const int32_t got = d.target_token(argmax_row(logits, r, V));
      if (r >= 1) EXPECT_EQ(got, argmax_row(want, r, V)) << what << " draft " << r;
      if (r < static_cast<int64_t>(drafts.size())) EXPECT_EQ(got, drafts[r]) << what << " row " << r;
    }
    // And end to end from our own features: the same drafts.
    const auto chained = inject_and_draft(d, p.features, n, last);
    for (int64_t r = 1; r < hp.block_size; ++r)
      EXPECT_EQ(argmax_row(chained, r, V), argmax_row(want, r, V)) << what << " end-to-end draft " << r;
  }
}

TEST(Dflash, GgufHparamsMapEveryKeyOfTheConvertedDrafter) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto d = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  const DflashHparams& hp = (*d)->hparams();
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_embd, 128);
  EXPECT_EQ(hp.n_ff, 256);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim, 32);
  EXPECT_EQ(hp.n_rot, 32);
  EXPECT_FLOAT_EQ(hp.rope_base, 1e7f);
  EXPECT_FLOAT_EQ(hp.eps, 1e-6f);
  EXPECT_EQ(hp.n_ctx_train, 4096);
  EXPECT_FALSE(hp.causal);
  EXPECT_EQ(hp.block_size, 16);
  EXPECT_EQ(hp.mask_token_id, 507);
  EXPECT_EQ(hp.target_layers, (std::vector<int>{2, 4, 6}));  // HF target_layer_ids [1, 3, 5] + 1
  EXPECT_EQ(hp.n_embd_target, 128);
  EXPECT_EQ(hp.n_features(), 384);
  EXPECT_EQ((*d)->n_vocab_draft(), 512);
  EXPECT_EQ((*d)->n_vocab_target(), 512);
  EXPECT_FALSE((*d)->has_d2t());
  EXPECT_EQ((*d)->d2t(), nullptr);
  EXPECT_EQ((*d)->target_token(42), 42);
  EXPECT_EQ((*d)->target_token(512), -1);
}

TEST(Dflash, FeaturesAndDraftLogitsMatchLlamaCppFromTheGguf) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto d = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  expect_drafts_match_llama_cpp(t, **d, "gguf");
}

TEST(Dflash, FeaturesAndDraftLogitsMatchLlamaCppFromTheHfDirectory) {
  Target t = load_target();
  const std::string dir = test::fixture_path(kDir + "hf");
  auto d = DflashModel::load_hf(*t.backend, dir, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  expect_drafts_match_llama_cpp(t, **d, "hf");
}

TEST(Dflash, HfDirectoryAndGgufGiveTheSameHparamsAndBitIdenticalLogits) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto g = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  auto h = DflashModel::load_hf(*t.backend, test::fixture_path(kDir + "hf"), DflashTarget::of(*t.model));
  ASSERT_TRUE(g.is_ok()) << g.message();
  ASSERT_TRUE(h.is_ok()) << h.message();
  const DflashHparams &a = (*g)->hparams(), &b = (*h)->hparams();
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_ff, b.n_ff);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_rot, b.n_rot);
  EXPECT_EQ(a.rope_base, b.rope_base);
  EXPECT_EQ(a.eps, b.eps);
  EXPECT_EQ(a.causal, b.causal);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.mask_token_id, b.mask_token_id);
  EXPECT_EQ(a.target_layers, b.target_layers);
  EXPECT_EQ(a.n_embd_target, b.n_embd_target);
  const auto features = test::read_f32_file(test::fixture_path(kDir + "text.features.f32"));
  const int64_t n = static_cast<int64_t>(features.size()) / a.n_features();
  const auto lg = inject_and_draft(**g, features, n, 373);
  const auto lh = inject_and_draft(**h, features, n, 373);
  EXPECT_EQ(max_abs_diff(lg, lh), 0.0f);
}

// The two oracles for the drafter's logits: an exact host reference (our backend must compute the
// same math to float rounding), and the same reference with llama.cpp's F16 attention arithmetic
// (which must reproduce llama.cpp's logits to the fixtures' usual 2e-3: the model semantics agree).
TEST(Dflash, ForwardEqualsAnExactHostReferenceAndTheReferenceExplainsLlamaCppToWithin2e3) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto d = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  const test::Reference ref(*f, *t.file, (*d)->hparams());
  const auto manifest = test::read_json_file(test::fixture_path(kDir + "manifest.json"));
  for (const auto& c : manifest["cases"]) {
    const std::string what = c["name"].get<std::string>();
    const auto features = test::read_f32_file(test::fixture_path(kDir + c["features"].get<std::string>()));
    const auto want = test::read_f32_file(test::fixture_path(kDir + c["draft_logits"].get<std::string>()));
    const int64_t n = static_cast<int64_t>(features.size()) / (*d)->hparams().n_features();
    const int32_t last = c["last_token"].get<int32_t>();
    const auto ours = inject_and_draft(**d, features, n, last);
    const float exact = max_abs_diff(ours, ref.inject_and_draft(features, n, last, false));
    const float llama = max_abs_diff(ref.inject_and_draft(features, n, last, true), want);
    report(what + " vs exact reference", exact);
    report(what + " f16-attention reference vs llama.cpp", llama);
    EXPECT_LE(exact, 1e-4f) << what;
    EXPECT_LE(llama, 2e-3f) << what;
  }
}

// Injecting the context in pieces (prefill, then accepted positions) equals one inject: each
// position's K/V depends on its own feature row only.
TEST(Dflash, InjectingTheContextInPiecesEqualsOneInject) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto d = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  DflashModel& m = **d;
  const auto features = test::read_f32_file(test::fixture_path(kDir + "chunk_cross.features.f32"));
  const int64_t n = static_cast<int64_t>(features.size()) / m.hparams().n_features(), B = m.hparams().block_size;
  const auto one_shot = inject_and_draft(m, features, n, 252);

  ASSERT_TRUE(m.reserve(std::max(n, B)).is_ok());
  auto st = m.create_state(n + B, GgmlType::F32);
  ASSERT_TRUE(st.is_ok());
  std::vector<int32_t> pos(n + B);
  for (int64_t i = 0; i < n + B; ++i) pos[i] = static_cast<int32_t>(i);
  // A stale draft block first (as after a verify), then the context in three pieces over it.
  std::vector<int32_t> block(B, m.hparams().mask_token_id);
  block[0] = 7;
  test::BackendArena io(m.backend());
  int32_t* pos_dev = io.put(pos);
  float* features_dev = io.put(features);
  DflashDraftArgs stale;
  stale.n = B;
  stale.tokens = io.put(block);
  stale.positions = pos_dev + 40;
  ASSERT_TRUE(m.draft(stale, *st).is_ok());
  for (int64_t s : {int64_t{0}, int64_t{37}, int64_t{41}}) {
    const int64_t e = s == 0 ? 37 : (s == 37 ? 41 : n);
    DflashInjectArgs in;
    in.n = e - s;
    in.features = Rows(features_dev + s * m.hparams().n_features(), e - s, m.hparams().n_features());
    in.positions = pos_dev + s;
    ASSERT_TRUE(m.inject(in, *st).is_ok());
  }
  block[0] = 252;
  DflashDraftArgs da;
  da.n = B;
  da.tokens = io.put(block);
  da.positions = pos_dev + n;
  da.logits = io.rows(B, m.n_vocab_draft());
  ASSERT_TRUE(m.draft(da, *st).is_ok());
  EXPECT_EQ(max_abs_diff(io.get(da.logits), one_shot), 0.0f);
}

TEST(Dflash, DraftRejectsMisshapenArguments) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto d = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(d.is_ok()) << d.message();
  DflashModel& m = **d;
  ASSERT_TRUE(m.reserve(16).is_ok());
  auto st = m.create_state(64, GgmlType::F32);
  ASSERT_TRUE(st.is_ok());
  std::vector<float> feats(17 * 384), logits(16 * 100);
  std::vector<int32_t> ids(17, 0);
  DflashInjectArgs in;
  in.n = 17;  // beyond the workspace
  in.features = Rows(feats.data(), 17, 384);
  in.positions = ids.data();
  EXPECT_FALSE(m.inject(in, *st).is_ok());
  in.n = 4;
  in.features = Rows(feats.data(), 4, 256);  // not n_tap * hidden
  EXPECT_FALSE(m.inject(in, *st).is_ok());
  DflashDraftArgs da;
  da.n = 16;
  da.tokens = ids.data();
  da.positions = ids.data();
  da.logits = Rows(logits.data(), 16, 100);  // not the vocabulary
  EXPECT_FALSE(m.draft(da, *st).is_ok());
  EXPECT_FALSE(m.create_state(64, GgmlType::Q4_0).is_ok());  // not a cache type
}

// ---- Rejection: truncated files and the upstream variants -------------------------------------

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Same-length in-place edit of a string stored in the file (a key, a value or a tensor name).
void replace_once(std::vector<uint8_t>& bytes, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
  ASSERT_NE(it, bytes.end()) << from;
  std::copy(to.begin(), to.end(), it);
}

Status load_from_bytes(Target& t, const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "edited-dflash.gguf");
  if (!f) return f.status();
  auto d = DflashModel::load(*t.backend, **f, DflashTarget::of(*t.model));
  return d.status();
}

TEST(DflashReject, TruncatedDrafterGgufIsAnErrorWhereverItIsCut) {
  Target t = load_target();
  const auto bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  ASSERT_TRUE(load_from_bytes(t, bytes).is_ok());
  for (size_t cut : {size_t{0}, size_t{3}, size_t{24}, size_t{200}, size_t{2000}, size_t{9000}, bytes.size() / 2,
                     bytes.size() - 4, bytes.size() - 1}) {
    const std::vector<uint8_t> part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    const Status s = load_from_bytes(t, part);
    EXPECT_FALSE(s.is_ok()) << "cut at " << cut;
    EXPECT_NE(s.message().find("edited-dflash.gguf"), std::string::npos) << s.message();
  }
}

TEST(DflashReject, DFlash2DrafterIsRejectedByName) {
  Target t = load_target();
  auto bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  replace_once(bytes, "blk.0.ffn_up.weight", "blk.0.ffn_conv_base");  // a DFlash2 per-layer conv tensor
  const Status s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("DFlash2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("blk.0.ffn_conv_base"), std::string::npos) << s.message();
}

TEST(DflashReject, DSparkDrafterIsRejectedByName) {
  Target t = load_target();
  auto bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  // A Markov head tensor of upstream DSpark ("markov_w1.weight"), in place of a same-length name.
  replace_once(bytes, "blk.1.ffn_norm.weight", "markov_w1.weight.....");
  Status s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("DSpark"), std::string::npos) << s.message();
  // The fork that declares its own architecture.
  bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  replace_once(bytes, std::string("\x06\0\0\0\0\0\0\0dflash", 14), std::string("\x06\0\0\0\0\0\0\0dspark", 14));
  s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("DSpark"), std::string::npos) << s.message();
}

TEST(DflashReject, UnknownTensorsAndBrokenMetadataAreErrorsThatNameThem) {
  Target t = load_target();
  auto bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  replace_once(bytes, "blk.1.attn_v.weight", "blk.1.attn_sinks.ww");
  Status s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("blk.1.attn_sinks.ww"), std::string::npos) << s.message();

  bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  replace_once(bytes, "dflash.target_layers", "dflash.target_layerz");
  s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("dflash.target_layers"), std::string::npos) << s.message();

  bytes = read_bytes(test::fixture_path(kDir + "dflash-tiny-f32.gguf"));
  replace_once(bytes, "tokenizer.ggml.mask_token_id", "tokenizer.ggml.mask_token_ix");
  s = load_from_bytes(t, bytes);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("mask"), std::string::npos) << s.message();
}

TEST(DflashReject, TheTargetMustNotBeADrafterAndTheDrafterNeedsATarget) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto as_target = Qwen35Model::load(*t.backend, *f, LoadOptions{});
  EXPECT_FALSE(as_target.is_ok());
  auto d = DflashModel::load(*t.backend, *f, DflashTarget{});
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.message().find("target"), std::string::npos) << d.message();
  DflashTarget shallow = DflashTarget::of(*t.model);
  shallow.n_layer = 4;  // taps 2, 4, 6 do not fit
  d = DflashModel::load(*t.backend, *f, shallow);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.message().find("target layer 6"), std::string::npos) << d.message();
}

// ---- Reduced draft vocabulary (d2t) ---------------------------------------------------------

GgufMetaValue owned(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::STRING:
      return GgufMetaValue::string(std::string(v.str));
    case GgufValueType::FLOAT32:
      return GgufMetaValue::f32(static_cast<float>(v.scalar.f));
    case GgufValueType::FLOAT64:
      return GgufMetaValue::f64(v.scalar.f);
    case GgufValueType::BOOL:
      return GgufMetaValue::boolean(v.scalar.b);
    case GgufValueType::ARRAY: {
      std::vector<GgufMetaValue> elems;
      for (const GgufValue& e : v.array) elems.push_back(owned(e));
      return GgufMetaValue::array(v.elem_type, std::move(elems));
    }
    case GgufValueType::UINT8:
      return GgufMetaValue::u8(static_cast<uint8_t>(v.scalar.u));
    case GgufValueType::INT8:
      return GgufMetaValue::i8(static_cast<int8_t>(v.scalar.i));
    case GgufValueType::UINT16:
      return GgufMetaValue::u16(static_cast<uint16_t>(v.scalar.u));
    case GgufValueType::INT16:
      return GgufMetaValue::i16(static_cast<int16_t>(v.scalar.i));
    case GgufValueType::UINT32:
      return GgufMetaValue::u32(static_cast<uint32_t>(v.scalar.u));
    case GgufValueType::INT32:
      return GgufMetaValue::i32(static_cast<int32_t>(v.scalar.i));
    case GgufValueType::INT64:
      return GgufMetaValue::i64(v.scalar.i);
    case GgufValueType::UINT64:
      return GgufMetaValue::u64(v.scalar.u);
  }
  return GgufMetaValue::u64(v.scalar.u);
}

// The fixture drafter plus its own LM head over `vocab` (rows of the target's head) and a d2t map,
// as a reduced-vocabulary export is laid out.
std::vector<uint8_t> reduced_vocab_drafter(const GgufFile& drafter, const GgufFile& target,
                                           const std::vector<int64_t>& vocab) {
  GgufWriter w;
  for (const auto& [key, value] : drafter.metadata()) {
    const Status st = w.set(key, owned(value));
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  for (const GgufTensorInfo& t : drafter.tensors())
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), {t.data, t.nbytes}).is_ok());
  const GgufTensorInfo* head = target.find_tensor("output.weight");
  std::vector<uint8_t> rows;
  for (int64_t id : vocab) {
    const uint8_t* r = head->data + id * head->ne[0] * sizeof(float);
    rows.insert(rows.end(), r, r + head->ne[0] * sizeof(float));
  }
  const auto* d2t = reinterpret_cast<const uint8_t*>(vocab.data());
  EXPECT_TRUE(
      w.add_tensor("output.weight", GgmlType::F32, {head->ne[0], static_cast<int64_t>(vocab.size())}, rows).is_ok());
  EXPECT_TRUE(
      w.add_tensor("d2t", GgmlType::I64, {static_cast<int64_t>(vocab.size())}, {d2t, vocab.size() * 8}).is_ok());
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.is_ok()) << bytes.message();
  return std::move(bytes).value();
}

TEST(DflashD2t, ReducedVocabularyDraftsAreTheFullDraftsRestrictedAndMappedToTargetIds) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  auto full = DflashModel::load(*t.backend, *f, DflashTarget::of(*t.model));
  ASSERT_TRUE(full.is_ok()) << full.message();
  // Every third token plus the drafts of the "text" case, in a scrambled order.
  std::vector<int64_t> vocab;
  for (int64_t id = 510; id >= 0; id -= 3) vocab.push_back(id);
  for (int64_t id : {65, 313}) vocab.push_back(id);
  const auto bytes = reduced_vocab_drafter(*f, *t.file, vocab);
  auto rf = GgufFile::parse(bytes.data(), bytes.size(), "reduced-vocab.gguf");
  ASSERT_TRUE(rf.is_ok()) << rf.message();
  auto red = DflashModel::load(*t.backend, **rf, DflashTarget::of(*t.model));
  ASSERT_TRUE(red.is_ok()) << red.message();
  DflashModel& r = **red;
  const int64_t Vd = static_cast<int64_t>(vocab.size()), Vt = 512, B = 16;
  ASSERT_TRUE(r.has_d2t());
  ASSERT_NE(r.d2t(), nullptr);
  EXPECT_EQ(r.n_vocab_draft(), Vd);
  EXPECT_EQ(r.n_vocab_target(), Vt);
  EXPECT_EQ(r.target_token(0), 510);
  EXPECT_EQ(r.target_token(static_cast<int32_t>(Vd - 1)), 313);
  EXPECT_EQ(r.target_token(static_cast<int32_t>(Vd)), -1);

  const auto features = test::read_f32_file(test::fixture_path(kDir + "text.features.f32"));
  const int64_t n = static_cast<int64_t>(features.size()) / r.hparams().n_features();
  const auto want = inject_and_draft(**full, features, n, 373);  // [B, Vt]
  const auto got = inject_and_draft(r, features, n, 373);        // [B, Vd]
  std::vector<float> scattered(static_cast<size_t>(B * Vt));
  r.logits_to_target(got.data(), B, scattered.data());
  for (int64_t row = 0; row < B; ++row) {
    for (int64_t i = 0; i < Vd; ++i)
      ASSERT_EQ(got[row * Vd + i], want[row * Vt + vocab[i]]) << "row " << row << " draft id " << i;
    for (int64_t id = 0; id < Vt; ++id) {
      const bool mapped = std::find(vocab.begin(), vocab.end(), id) != vocab.end();
      if (mapped)
        EXPECT_EQ(scattered[row * Vt + id], want[row * Vt + id]);
      else
        EXPECT_EQ(scattered[row * Vt + id], -std::numeric_limits<float>::infinity());
    }
    // The text case's drafts (65, then 313) are in the reduced vocabulary, so they survive.
    EXPECT_EQ(r.target_token(argmax_row(got, row, Vd)), argmax_row(want, row, Vt)) << "row " << row;
  }
}

TEST(DflashD2t, AD2tEntryOutsideTheTargetVocabularyIsRejected) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  const auto bytes = reduced_vocab_drafter(*f, *t.file, {1, 2, 512});
  auto rf = GgufFile::parse(bytes.data(), bytes.size(), "reduced-vocab.gguf");
  ASSERT_TRUE(rf.is_ok()) << rf.message();
  auto red = DflashModel::load(*t.backend, **rf, DflashTarget::of(*t.model));
  ASSERT_FALSE(red.is_ok());
  EXPECT_NE(red.message().find("d2t[2] = 512"), std::string::npos) << red.message();
}

// ---- The HF directory's own checks --------------------------------------------------------

// A copy of the fixture's HF directory with config.json edited and tensors added (name, dtype, shape, bytes).
struct ExtraTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
std::string hf_copy(const std::string& tag, const std::function<void(nlohmann::json&)>& edit,
                    const std::vector<ExtraTensor>& extra = {}) {
  const std::filesystem::path src = test::fixture_path(kDir + "hf");
  const std::filesystem::path dst = std::filesystem::path(::testing::TempDir()) / ("dflash-hf-" + tag);
  std::filesystem::remove_all(dst);
  std::filesystem::create_directories(dst);
  auto config = test::read_json_file((src / "config.json").string());
  edit(config);
  std::ofstream(dst / "config.json") << config.dump(1);
  auto st = SafetensorsFile::open((src / "model.safetensors").string());
  EXPECT_TRUE(st.is_ok()) << st.message();
  nlohmann::json header = nlohmann::json::object();
  std::vector<uint8_t> data;
  auto put = [&](const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, const uint8_t* p,
                 size_t n) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.insert(data.end(), p, p + n);
  };
  for (const SafetensorsTensor& t : (*st)->tensors())
    put(t.name, std::string(safetensors_dtype_name(t.dtype)), t.shape, t.data, t.nbytes);
  for (const ExtraTensor& t : extra) put(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  const uint64_t len = h.size();
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return dst.string();
}

TEST(DflashHf, VariantsAndUnsupportedConfigsAreRejectedByName) {
  Target t = load_target();
  const DflashTarget target = DflashTarget::of(*t.model);
  struct Case {
    std::string tag, expect;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Case> cases = {
      {"dflash2", "DFlash2", [](nlohmann::json& c) { c["architectures"] = {"DFlash2DraftModel"}; }},
      {"dspark", "DSpark", [](nlohmann::json& c) { c["architectures"] = {"DSparkDraftModel"}; }},
      {"no-dflash-config", "dflash_config", [](nlohmann::json& c) { c.erase("dflash_config"); }},
      {"no-mask", "mask_token_id", [](nlohmann::json& c) { c["dflash_config"].erase("mask_token_id"); }},
      {"swa", "sliding-window", [](nlohmann::json& c) { c["use_sliding_window"] = true; }},
      {"yarn", "rope type 'yarn'",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
       }},
      {"taps", "target features of hidden size 192",
       [](nlohmann::json& c) {
         c["dflash_config"]["target_layer_ids"] = {1, 3};
       }},
  };
  for (const Case& c : cases) {
    auto d = DflashModel::load_hf(*t.backend, hf_copy(c.tag, c.edit), target);
    ASSERT_FALSE(d.is_ok()) << c.tag;
    EXPECT_NE(d.message().find(c.expect), std::string::npos) << c.tag << ": " << d.message();
  }
  const std::vector<uint8_t> four(16, 0);
  auto d = DflashModel::load_hf(
      *t.backend, hf_copy("conv", [](nlohmann::json&) {}, {{"layers.0.attn_conv_proj.weight", "F32", {2, 2}, four}}),
      target);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.message().find("layers.0.attn_conv_proj.weight"), std::string::npos) << d.message();
  d = DflashModel::load_hf(*t.backend, ::testing::TempDir() + "/no-such-drafter", target);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.message().find("no-such-drafter"), std::string::npos) << d.message();
}

// HF reduced-vocabulary exports store d2t as offsets (target id = draft id + d2t[id]); the GGUF
// stores target ids. Both layouts of the same head must draft the same logits.
TEST(DflashHf, ReducedVocabularyWithD2tOffsetsEqualsTheGgufWithD2tIds) {
  Target t = load_target();
  auto f = open_drafter_gguf();
  std::vector<int64_t> vocab;
  for (int64_t id = 0; id < 512; id += 2) vocab.push_back(id);
  vocab.push_back(373);
  const auto bytes = reduced_vocab_drafter(*f, *t.file, vocab);
  auto rf = GgufFile::parse(bytes.data(), bytes.size(), "reduced-vocab.gguf");
  ASSERT_TRUE(rf.is_ok()) << rf.message();
  auto g = DflashModel::load(*t.backend, **rf, DflashTarget::of(*t.model));
  ASSERT_TRUE(g.is_ok()) << g.message();

  const GgufTensorInfo* head = rf.value()->find_tensor("output.weight");
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < vocab.size(); ++i) offsets.push_back(vocab[i] - static_cast<int64_t>(i));
  const auto* off = reinterpret_cast<const uint8_t*>(offsets.data());
  const std::string dir = hf_copy(
      "d2t", [](nlohmann::json&) {},
      {{"lm_head.weight",
        "F32",
        {head->ne[1], head->ne[0]},
        std::vector<uint8_t>(head->data, head->data + head->nbytes)},
       {"d2t", "I64", {static_cast<int64_t>(offsets.size())}, std::vector<uint8_t>(off, off + offsets.size() * 8)},
       {"t2d", "BOOL", {512}, std::vector<uint8_t>(512, 1)}});
  auto h = DflashModel::load_hf(*t.backend, dir, DflashTarget::of(*t.model));
  ASSERT_TRUE(h.is_ok()) << h.message();
  ASSERT_TRUE((*h)->has_d2t());
  EXPECT_EQ((*h)->n_vocab_draft(), static_cast<int64_t>(vocab.size()));
  for (int32_t i = 0; i < static_cast<int32_t>(vocab.size()); ++i) EXPECT_EQ((*h)->target_token(i), vocab[i]);
  const auto features = test::read_f32_file(test::fixture_path(kDir + "short.features.f32"));
  const int64_t n = static_cast<int64_t>(features.size()) / (*g)->hparams().n_features();
  EXPECT_EQ(max_abs_diff(inject_and_draft(**g, features, n, 188), inject_and_draft(**h, features, n, 188)), 0.0f);
}

}  // namespace
}  // namespace hyspec
