// Test-only: an independent host reference of the DFlash drafter (see the class comment).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/dflash.h"
#include "util/half.h"

namespace hyspec::test {

// An independent host reference of the drafter (DFLASH.md), straight from the f32 GGUF tensors, in
// double precision. With f16_attention it also reproduces how llama.cpp's CPU flash attention
// computes (ggml_compute_forward_flash_attn_ext with an F16 cache: Q, K, V rounded to F16 and the
// V·softmax sum accumulated in an F16 vector): that arithmetic, not the model, is what separates
// llama.cpp's draft logits from an exact computation by up to 7e-3 on these fixtures.
class Reference {
 public:
  Reference(const GgufFile& drafter, const GgufFile& target, const DflashHparams& hp)
      : d_(drafter), t_(target), hp_(hp) {}

  std::vector<float> inject_and_draft(const std::vector<float>& features, int64_t n, int32_t last,
                                      bool f16_attention) const {
    const int64_t B = hp_.block_size, E = hp_.n_embd, D = hp_.head_dim, H = hp_.n_head, Hkv = hp_.n_head_kv;
    const int64_t L = n + B, KV = Hkv * D;
    std::vector<std::vector<double>> K(hp_.n_layer, std::vector<double>(L * KV)), V = K;
    for (int64_t p = 0; p < n; ++p) {
      const std::vector<double> f(features.begin() + p * hp_.n_features(),
                                  features.begin() + (p + 1) * hp_.n_features());
      const auto g = rms_norm(matvec("fc.weight", f, d_), "enc.output_norm.weight", E);
      for (int l = 0; l < hp_.n_layer; ++l) {
        auto k = head_norm(matvec(blk(l, "attn_k.weight"), g, d_), blk(l, "attn_k_norm.weight"));
        rope(k, p);
        const auto v = matvec(blk(l, "attn_v.weight"), g, d_);
        std::copy(k.begin(), k.end(), K[l].begin() + p * KV);
        std::copy(v.begin(), v.end(), V[l].begin() + p * KV);
      }
    }
    std::vector<std::vector<double>> x(B);
    for (int64_t r = 0; r < B; ++r) x[r] = row(t_, "token_embd.weight", r == 0 ? last : hp_.mask_token_id);
    for (int l = 0; l < hp_.n_layer; ++l) {
      std::vector<std::vector<double>> q(B);
      for (int64_t r = 0; r < B; ++r) {
        const auto h = rms_norm(x[r], blk(l, "attn_norm.weight"), E);
        q[r] = head_norm(matvec(blk(l, "attn_q.weight"), h, d_), blk(l, "attn_q_norm.weight"));
        auto k = head_norm(matvec(blk(l, "attn_k.weight"), h, d_), blk(l, "attn_k_norm.weight"));
        rope(q[r], n + r);
        rope(k, n + r);
        const auto v = matvec(blk(l, "attn_v.weight"), h, d_);
        std::copy(k.begin(), k.end(), K[l].begin() + (n + r) * KV);
        std::copy(v.begin(), v.end(), V[l].begin() + (n + r) * KV);
      }
      for (int64_t r = 0; r < B; ++r) {
        std::vector<double> att(H * D);
        for (int64_t hd = 0; hd < H; ++hd) {
          const int64_t kvh = hd / (H / Hkv);
          attend(&q[r][hd * D], K[l], V[l], kvh, L, f16_attention, &att[hd * D]);
        }
        add(x[r], matvec(blk(l, "attn_output.weight"), att, d_));
        const auto h = rms_norm(x[r], blk(l, "ffn_norm.weight"), E);
        auto gate = matvec(blk(l, "ffn_gate.weight"), h, d_);
        const auto up = matvec(blk(l, "ffn_up.weight"), h, d_);
        for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
        add(x[r], matvec(blk(l, "ffn_down.weight"), gate, d_));
      }
    }
    std::vector<float> logits;
    for (int64_t r = 0; r < B; ++r)
      for (double v : matvec("output.weight", rms_norm(x[r], "output_norm.weight", E), t_))
        logits.push_back(static_cast<float>(v));
    return logits;
  }

 private:
  static std::string blk(int l, const char* name) { return "blk." + std::to_string(l) + "." + name; }
  static double f16(double v) { return fp16_to_fp32(fp32_to_fp16(static_cast<float>(v))); }
  static const float* data(const GgufFile& f, const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    EXPECT_TRUE(t && t->type == GgmlType::F32) << name;
    return reinterpret_cast<const float*>(t->data);
  }
  static std::vector<double> row(const GgufFile& f, const std::string& name, int64_t r) {
    const int64_t n_in = f.find_tensor(name)->ne[0];
    const float* w = data(f, name) + r * n_in;
    return std::vector<double>(w, w + n_in);
  }
  static std::vector<double> matvec(const std::string& name, const std::vector<double>& x, const GgufFile& f) {
    const GgufTensorInfo* t = f.find_tensor(name);
    const float* w = data(f, name);
    std::vector<double> y(static_cast<size_t>(t->ne[1]));
    for (int64_t o = 0; o < t->ne[1]; ++o)
      for (int64_t i = 0; i < t->ne[0]; ++i) y[o] += static_cast<double>(w[o * t->ne[0] + i]) * x[i];
    return y;
  }
  std::vector<double> rms_norm(std::vector<double> x, const std::string& weight, int64_t group) const {
    const float* w = data(d_, weight);
    for (size_t g0 = 0; g0 < x.size(); g0 += group) {
      double ss = 0;
      for (int64_t i = 0; i < group; ++i) ss += x[g0 + i] * x[g0 + i];
      const double inv = 1 / std::sqrt(ss / group + hp_.eps);
      for (int64_t i = 0; i < group; ++i) x[g0 + i] *= inv * w[i];
    }
    return x;
  }
  std::vector<double> head_norm(std::vector<double> x, const std::string& weight) const {
    return rms_norm(std::move(x), weight, hp_.head_dim);
  }
  void rope(std::vector<double>& x, int64_t pos) const {
    const int64_t D = hp_.head_dim, half = hp_.n_rot / 2;
    for (size_t h0 = 0; h0 < x.size(); h0 += D)
      for (int64_t i = 0; i < half; ++i) {
        const double th = pos * std::pow(static_cast<double>(hp_.rope_base), -2.0 * i / hp_.n_rot);
        const double a = x[h0 + i], b = x[h0 + i + half];
        x[h0 + i] = a * std::cos(th) - b * std::sin(th);
        x[h0 + i + half] = a * std::sin(th) + b * std::cos(th);
      }
  }
  static void add(std::vector<double>& x, const std::vector<double>& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  // softmax(q·K / sqrt(D)) V over all L keys (the block is non-causal), exact or as ggml's F16 path.
  void attend(const double* q, const std::vector<double>& K, const std::vector<double>& V, int64_t kvh, int64_t L,
              bool f16_attention, double* out) const {
    const int64_t D = hp_.head_dim, KV = int64_t{hp_.n_head_kv} * D;
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    double M = -INFINITY, S = 0;
    std::vector<double> acc(D, 0.0);
    for (int64_t j = 0; j < L; ++j) {
      const double* k = &K[j * KV + kvh * D];
      const double* v = &V[j * KV + kvh * D];
      double s = 0;
      for (int64_t i = 0; i < D; ++i) s += (f16_attention ? f16(q[i]) * f16(k[i]) : q[i] * k[i]);
      s = f16_attention ? static_cast<float>(s) * static_cast<float>(scale) : s * scale;
      double ms = 1, vs = 1;
      if (s > M) {
        ms = std::exp(M - s);
        M = s;
        for (double& a : acc) a = f16_attention ? f16(a * ms) : a * ms;
      } else {
        vs = std::exp(s - M);
      }
      for (int64_t i = 0; i < D; ++i) acc[i] = f16_attention ? f16(acc[i] + f16(v[i]) * vs) : acc[i] + v[i] * vs;
      S = S * ms + vs;
    }
    for (int64_t i = 0; i < D; ++i) out[i] = acc[i] / S;
  }

  const GgufFile& d_;
  const GgufFile& t_;
  DflashHparams hp_;
};

}  // namespace hyspec::test
