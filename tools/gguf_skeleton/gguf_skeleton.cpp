// A model file's skeleton, and random weights in it: device probes' A/B builds then need a 9B-shaped
// Q4_K_M file in seconds instead of the anchor's ~190 s (transformers, llama.cpp's converter and
// llama-quantize), with the exact header of the anchor's file (tensor names, shapes, types, metadata).
//   gguf_skeleton skeleton IN.gguf OUT.gguf   IN's header, then a hole to IN's size (sparse; xz packs it
//                                             to its header's size)
//   gguf_skeleton fill FILE.gguf [SEED]       every tensor of FILE rewritten in place with random data
//                                             of finite, model-like size (see fill_tensor)
//   gguf_skeleton add-nextn IN.gguf OUT.gguf  IN's header (a Qwen3.5 target) with one MTP block added as
//                                             the converters lay it out, as a skeleton to fill: blk.N.* in
//                                             the shapes and types of the last full-attention block's, the
//                                             nextn.eh_proj / enorm / hnorm, block_count N + 1 and
//                                             nextn_predict_layers 1 (the anchor's files have no MTP head)
//   gguf_skeleton resize IN.gguf OUT.gguf EMBD FFN LAYERS HEADS V_HEADS
//                                             IN (a qwen35 file) at another shape, as a skeleton to fill:
//                                             embedding and FFN width, trunk layers, attention heads and
//                                             GDN value heads (head dims, kv and key heads kept), in IN's
//                                             tensor order and per-tensor types, with llama.cpp's per-layer
//                                             choice (use_more_bits) for attn_qkv / attn_v and ffn_down;
//                                             refused unless IN at its own shape comes out as IN (the
//                                             anchor's 9B -> its 27B: 5120 17408 64 24 48)
//   gguf_skeleton dflash-for TARGET.gguf OUT.gguf [LAYERS]
//                                             a DFlash drafter for TARGET as a skeleton to fill: LAYERS
//                                             (5) Qwen3-style layers of TARGET's width and FFN (32 heads,
//                                             8 kv heads of 128), Q8_0 matrices, 5 taps, block 16, the
//                                             target's head borrowed (no 9B-shaped drafter is at hand)
// Timing A/Bs only: the weights are noise, so the output text is too.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace hyspec {
namespace {

// xorshift64*: fast, and the same bytes for the same seed.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed ? seed : 0x9e3779b97f4a7c15ull) {}
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.0f; }
};

uint64_t hash(std::string_view s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Byte offsets of the f16 scales in a block of each quantized type (ggml's block layouts); the rest of
// the block (codes, sub-block scales) is random bits. d = 1e-4 keeps every weight below ~0.5.
struct ScaleFields {
  int n = 0;
  int at[2] = {0, 0};
};
bool scale_fields(GgmlType t, ScaleFields& f) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      f = {1, {0, 0}};
      return true;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
      f = {2, {0, 2}};
      return true;
    case GgmlType::Q2_K: f = {2, {80, 82}}; return true;
    case GgmlType::Q3_K: f = {1, {108, 0}}; return true;
    case GgmlType::Q6_K: f = {1, {208, 0}}; return true;
    default: return false;
  }
}

// F32 vectors by role, so that the recurrence and the norms stay finite: norm weights 1, the GDN decay
// rates (ssm_a = -exp(A_log)) in [-2, -0.5], dt biases 0, everything else (conv taps) small.
float f32_value(std::string_view name, Rng& r) {
  if (name.find("norm") != std::string_view::npos) return 1.0f;
  if (name.ends_with(".ssm_a")) return r.uniform(-2.0f, -0.5f);
  if (name.find("ssm_dt") != std::string_view::npos) return 0.0f;
  return r.uniform(-0.3f, 0.3f);
}

Status fill_tensor(const GgufTensorInfo& t, uint8_t* data, uint64_t seed) {
  Rng r(hash(t.name, seed));
  const size_t n = t.nbytes;
  switch (t.type) {
    case GgmlType::F32:
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const float v = f32_value(t.name, r);
        std::memcpy(data + i, &v, 4);
      }
      return Status::ok();
    case GgmlType::F16:
      for (size_t i = 0; i + 2 <= n; i += 2) put_f16(data + i, r.uniform(-0.05f, 0.05f));
      return Status::ok();
    case GgmlType::BF16:
      for (size_t i = 0; i + 2 <= n; i += 2) {
        const uint16_t b = fp32_to_bf16(r.uniform(-0.05f, 0.05f));
        std::memcpy(data + i, &b, 2);
      }
      return Status::ok();
    default: break;
  }
  ScaleFields f;
  const size_t block = ggml_type_traits(t.type).type_size;
  if (!scale_fields(t.type, f) || block == 0 || n % block != 0)
    return Status::errorf("tensor '{}': no fill for type {}", t.name, ggml_type_name(t.type));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = r.next();
    std::memcpy(data + i, &v, 8);
  }
  for (; i < n; ++i) data[i] = static_cast<uint8_t>(r.next());
  for (size_t b = 0; b < n; b += block)
    for (int k = 0; k < f.n; ++k) put_f16(data + b + f.at[k], 1e-4f);
  return Status::ok();
}

Status skeleton(const std::string& in, const std::string& out) {
  HS_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(in));
  HS_ASSIGN_OR_RETURN(auto file, GgufFile::parse(m.data(), m.size(), in));
  const size_t header = std::min(file->data_offset(), m.size());
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::errorf("{}: cannot create: {}", out, std::strerror(errno));
  bool ok = true;
  for (size_t done = 0; ok && done < header;) {
    const ssize_t k = ::write(fd, m.data() + done, header - done);
    ok = k > 0;
    done += ok ? static_cast<size_t>(k) : 0;
  }
  ok = ok && ::ftruncate(fd, static_cast<off_t>(m.size())) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok) return Status::errorf("{}: write failed: {}", out, std::strerror(errno));
  std::fprintf(stderr, "%s: %zu header bytes of %zu (%zu tensors)\n", out.c_str(), header, m.size(), file->tensors().size());
  return Status::ok();
}

Status add_nextn(const std::string& in, const std::string& out) {
  HS_ASSIGN_OR_RETURN(auto file, GgufFile::open(in));
  HS_ASSIGN_OR_RETURN(std::string_view arch_view, file->get_string("general.architecture"));
  const std::string arch(arch_view);
  HS_ASSIGN_OR_RETURN(int64_t blocks, file->get_int(arch + ".block_count"));
  HS_ASSIGN_OR_RETURN(int64_t E, file->get_int(arch + ".embedding_length"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, file->get_int_or(arch + ".nextn_predict_layers", 0));
  if (nextn != 0) return Status::errorf("{}: has {} nextn block(s) already", in, nextn);
  int64_t last = -1;
  for (int64_t i = 0; i < blocks; ++i)
    if (file->find_tensor(fmt::format("blk.{}.attn_q.weight", i))) last = i;
  if (last < 0) return Status::errorf("{}: no full-attention block to copy", in);
  const GgufTensorInfo* out_proj = file->find_tensor(fmt::format("blk.{}.attn_output.weight", last));
  if (!out_proj) return Status::errorf("{}: blk.{}.attn_output.weight missing", in, last);

  GgufWriter w;
  for (const auto& [key, value] : file->metadata())
    HS_RETURN_IF_ERROR(w.set(key, key == arch + ".block_count" ? GgufMetaValue::u32(static_cast<uint32_t>(blocks + 1))
                                                              : GgufMetaValue::from(value)));
  HS_RETURN_IF_ERROR(w.set(arch + ".nextn_predict_layers", GgufMetaValue::u32(1)));
  auto dims = [](const GgufTensorInfo& t) { return std::vector<int64_t>(t.ne, t.ne + t.n_dims); };
  for (const GgufTensorInfo& t : file->tensors()) HS_RETURN_IF_ERROR(w.add_tensor_shape(t.name, t.type, dims(t)));
  const std::string from = fmt::format("blk.{}.", last), to = fmt::format("blk.{}.", blocks);
  int copied = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (!t.name.starts_with(from)) continue;
    HS_RETURN_IF_ERROR(w.add_tensor_shape(to + t.name.substr(from.size()), t.type, dims(t)));
    ++copied;
  }
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.eh_proj.weight", out_proj->type, {2 * E, E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.enorm.weight", GgmlType::F32, {E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.hnorm.weight", GgmlType::F32, {E}));
  HS_RETURN_IF_ERROR(w.write_skeleton(out));
  std::fprintf(stderr, "%s: blk.%lld as block %lld's copy (%d tensors) and its nextn tensors\n", out.c_str(),
               static_cast<long long>(blocks), static_cast<long long>(last), copied);
  return Status::ok();
}

// The shape a qwen35 file's tensors follow (resize).
struct Qwen35Shape {
  int64_t embd, ffn, trunk, heads, kv_heads, head_dim, k_heads, k_dim, v_heads, v_dim, conv, vocab, interval;
};

// Whether block b of a file at shape s is a recurrent (GDN) one: a trunk block off the full-attention interval.
bool qwen35_recurrent(int64_t b, const Qwen35Shape& s) { return b < s.trunk && (b + 1) % s.interval != 0; }

// The dims of tensor `suffix` (the name past "blk.N.", or a whole non-block name) at shape s.
Result<std::vector<int64_t>> qwen35_dims(std::string_view suffix, const Qwen35Shape& s) {
  const int64_t E = s.embd, inner = s.v_heads * s.v_dim, qkv = 2 * s.k_heads * s.k_dim + inner;
  if (suffix == "token_embd.weight" || suffix == "output.weight") return std::vector<int64_t>{E, s.vocab};
  if (suffix == "output_norm.weight" || suffix == "attn_norm.weight" || suffix == "post_attention_norm.weight" ||
      suffix == "nextn.enorm.weight" || suffix == "nextn.hnorm.weight" || suffix == "nextn.shared_head_norm.weight")
    return std::vector<int64_t>{E};
  if (suffix == "attn_qkv.weight") return std::vector<int64_t>{E, qkv};
  if (suffix == "attn_gate.weight") return std::vector<int64_t>{E, inner};
  if (suffix == "ssm_out.weight") return std::vector<int64_t>{inner, E};
  if (suffix == "ssm_conv1d.weight") return std::vector<int64_t>{s.conv, qkv};
  if (suffix == "ssm_a" || suffix == "ssm_dt.bias") return std::vector<int64_t>{s.v_heads};
  if (suffix == "ssm_alpha.weight" || suffix == "ssm_beta.weight") return std::vector<int64_t>{E, s.v_heads};
  if (suffix == "ssm_norm.weight") return std::vector<int64_t>{s.v_dim};
  if (suffix == "attn_q.weight") return std::vector<int64_t>{E, 2 * s.heads * s.head_dim};  // queries and their gates
  if (suffix == "attn_k.weight" || suffix == "attn_v.weight") return std::vector<int64_t>{E, s.kv_heads * s.head_dim};
  if (suffix == "attn_output.weight") return std::vector<int64_t>{s.heads * s.head_dim, E};
  if (suffix == "attn_q_norm.weight" || suffix == "attn_k_norm.weight") return std::vector<int64_t>{s.head_dim};
  if (suffix == "ffn_gate.weight" || suffix == "ffn_up.weight") return std::vector<int64_t>{E, s.ffn};
  if (suffix == "ffn_down.weight") return std::vector<int64_t>{s.ffn, E};
  if (suffix == "nextn.eh_proj.weight") return std::vector<int64_t>{2 * E, E};
  return Status::errorf("tensor '{}': no resize rule", suffix);
}

// llama.cpp's llama-quant.cpp: the layers whose attn_v (counted with the GDN's attn_qkv) and ffn_down
// take more bits in its _M mixes.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct ShapedTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  bool operator==(const ShapedTensor&) const = default;
};

// IN's tensor list at shape s: non-block tensors where IN has them; the trunk's blocks, where IN has its
// own, as copies of IN's first recurrent or first full-attention block (their order and types), renamed
// and reshaped; IN's nextn blocks after them, renumbered. attn_qkv / attn_v and ffn_down take the type
// IN gives such a tensor where use_more_bits agrees (counted over the file as llama.cpp counts them).
Result<std::vector<ShapedTensor>> qwen35_tensors(const GgufFile& in, const Qwen35Shape& from, const Qwen35Shape& s) {
  auto block_of = [](std::string_view name, std::string_view& suffix) -> int64_t {
    const int b = gguf_block_index(name);
    if (b >= 0) suffix = name.substr(name.find('.', 4) + 1);
    return b;
  };
  auto wv = [](std::string_view suffix) { return suffix == "attn_qkv.weight" || suffix == "attn_v.weight"; };
  // The attn_qkv / attn_v and ffn_down tensors of a list, counted as use_more_bits counts them.
  auto count_classes = [&](const GgufTensorInfo& t, int64_t& n_wv, int64_t& n_down) {
    std::string_view suffix;
    const bool block = block_of(t.name, suffix) >= 0;
    n_wv += block && wv(suffix);
    n_down += block && suffix == "ffn_down.weight";
  };
  // The template blocks, and the types IN gives the use_more_bits classes ([0]: fewer bits, [1]: more).
  int64_t first_rec = -1, first_full = -1, n_wv = 0, n_down = 0;
  std::optional<GgmlType> wv_type[2], down_type[2];
  for (const GgufTensorInfo& t : in.tensors()) count_classes(t, n_wv, n_down);
  int64_t i_wv = 0, i_down = 0;
  for (const GgufTensorInfo& t : in.tensors()) {
    std::string_view suffix;
    const int64_t b = block_of(t.name, suffix);
    if (b < 0) continue;
    if (qwen35_recurrent(b, from) && first_rec < 0) first_rec = b;
    if (b < from.trunk && !qwen35_recurrent(b, from) && first_full < 0) first_full = b;
    std::optional<GgmlType>* slot = nullptr;
    if (wv(suffix)) slot = &wv_type[use_more_bits(i_wv++, n_wv)];
    if (suffix == "ffn_down.weight") slot = &down_type[use_more_bits(i_down++, n_down)];
    if (slot && !*slot) *slot = t.type;
  }
  if (first_rec < 0 || first_full < 0) return Status::error("no recurrent or no full-attention block to copy");
  // (new block or -1, IN's tensor) in the new file's order. IN's trunk must be one run of tensors (it is
  // in the converter's and llama-quantize's files): the new trunk replaces it.
  std::vector<std::pair<int64_t, const GgufTensorInfo*>> emitted;
  const auto& all = in.tensors();
  bool trunk_seen = false;
  for (size_t i = 0; i < all.size(); ++i) {
    std::string_view suffix;
    const int64_t b = block_of(all[i].name, suffix);
    if (b < 0 || b >= from.trunk) {
      emitted.emplace_back(b < 0 ? -1 : s.trunk + (b - from.trunk), &all[i]);
      continue;
    }
    if (trunk_seen) {
      std::string_view prev_suffix;
      const int64_t pb = block_of(all[i - 1].name, prev_suffix);
      if (pb < 0 || pb >= from.trunk) return Status::errorf("the trunk's blocks are not one run of tensors (at {})", all[i].name);
      continue;
    }
    trunk_seen = true;
    for (int64_t nb = 0; nb < s.trunk; ++nb) {
      const std::string tmpl = fmt::format("blk.{}.", qwen35_recurrent(nb, s) ? first_rec : first_full);
      for (const GgufTensorInfo& u : all)
        if (u.name.starts_with(tmpl)) emitted.emplace_back(nb, &u);
    }
  }
  int64_t wv_total = 0, down_total = 0;
  for (const auto& [nb, t] : emitted) count_classes(*t, wv_total, down_total);
  std::vector<ShapedTensor> out;
  int64_t j_wv = 0, j_down = 0;
  for (const auto& [nb, t] : emitted) {
    std::string_view suffix = t->name;
    if (nb >= 0) block_of(t->name, suffix);
    HS_ASSIGN_OR_RETURN(std::vector<int64_t> at_from, qwen35_dims(suffix, from));
    if (static_cast<int>(at_from.size()) != t->n_dims || !std::equal(at_from.begin(), at_from.end(), t->ne))
      return Status::errorf("{} is {}, not the shape the resize rules give it", t->name, t->shape_string());
    HS_ASSIGN_OR_RETURN(std::vector<int64_t> ne, qwen35_dims(suffix, s));
    std::optional<GgmlType> type = t->type;
    if (nb >= 0 && wv(suffix)) type = wv_type[use_more_bits(j_wv++, wv_total)];
    if (nb >= 0 && suffix == "ffn_down.weight") type = down_type[use_more_bits(j_down++, down_total)];
    if (!type) return Status::errorf("{}: IN has no tensor of its bits class to take a type from", t->name);
    out.push_back({nb >= 0 ? fmt::format("blk.{}.{}", nb, suffix) : t->name, *type, std::move(ne)});
  }
  return out;
}

Status resize(const std::string& in_path, const std::string& out, Qwen35Shape to) {
  HS_ASSIGN_OR_RETURN(auto in, GgufFile::open(in_path));
  HS_ASSIGN_OR_RETURN(std::string_view arch_view, in->get_string("general.architecture"));
  if (arch_view != "qwen35") return Status::errorf("{}: architecture '{}', not qwen35", in_path, arch_view);
  const std::string a = "qwen35.";
  auto get = [&](const char* key) { return in->get_int(a + key); };
  Qwen35Shape from{};
  HS_ASSIGN_OR_RETURN(int64_t blocks, get("block_count"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, in->get_int_or(a + "nextn_predict_layers", 0));
  HS_ASSIGN_OR_RETURN(from.embd, get("embedding_length"));
  HS_ASSIGN_OR_RETURN(from.ffn, get("feed_forward_length"));
  HS_ASSIGN_OR_RETURN(from.heads, get("attention.head_count"));
  HS_ASSIGN_OR_RETURN(from.kv_heads, get("attention.head_count_kv"));
  HS_ASSIGN_OR_RETURN(from.head_dim, get("attention.key_length"));
  HS_ASSIGN_OR_RETURN(from.k_heads, get("ssm.group_count"));
  HS_ASSIGN_OR_RETURN(from.k_dim, get("ssm.state_size"));
  HS_ASSIGN_OR_RETURN(from.v_heads, get("ssm.time_step_rank"));
  HS_ASSIGN_OR_RETURN(int64_t inner, get("ssm.inner_size"));
  HS_ASSIGN_OR_RETURN(from.conv, get("ssm.conv_kernel"));
  HS_ASSIGN_OR_RETURN(from.interval, get("full_attention_interval"));
  const GgufTensorInfo* embd = in->find_tensor("token_embd.weight");
  if (!embd || embd->n_dims != 2) return Status::errorf("{}: no 2-D token_embd.weight", in_path);
  from.vocab = embd->ne[1];
  from.trunk = blocks - nextn;
  if (from.v_heads <= 0 || inner % from.v_heads != 0 || from.interval <= 0 || from.trunk <= 0)
    return Status::errorf("{}: inconsistent GDN or layer metadata", in_path);
  from.v_dim = inner / from.v_heads;
  if (to.embd <= 0 || to.ffn <= 0 || to.trunk <= 0 || to.heads <= 0 || to.v_heads <= 0)
    return Status::error("EMBD, FFN, LAYERS, HEADS and V_HEADS must be positive");
  to.kv_heads = from.kv_heads, to.head_dim = from.head_dim, to.k_heads = from.k_heads, to.k_dim = from.k_dim;
  to.v_dim = from.v_dim, to.conv = from.conv, to.vocab = from.vocab, to.interval = from.interval;

  // The rules must give IN back at IN's own shape: names, order, dims and types.
  HS_ASSIGN_OR_RETURN(std::vector<ShapedTensor> self, qwen35_tensors(*in, from, from));
  if (self.size() != in->tensors().size()) return Status::errorf("{}: the resize rules do not give it back", in_path);
  for (size_t i = 0; i < self.size(); ++i) {
    const GgufTensorInfo& t = in->tensors()[i];
    const ShapedTensor mine{t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims)};
    if (!(self[i] == mine))
      return Status::errorf("{}: the resize rules give {} {} as {} {}", in_path, t.name, ggml_type_name(t.type),
                            self[i].name, ggml_type_name(self[i].type));
  }
  HS_ASSIGN_OR_RETURN(std::vector<ShapedTensor> tensors, qwen35_tensors(*in, from, to));

  GgufWriter w;
  auto same_type = [](const GgufValue& v, int64_t x) -> Result<GgufMetaValue> {
    switch (v.type) {
      case GgufValueType::UINT32: return GgufMetaValue::u32(static_cast<uint32_t>(x));
      case GgufValueType::INT32: return GgufMetaValue::i32(static_cast<int32_t>(x));
      case GgufValueType::UINT64: return GgufMetaValue::u64(static_cast<uint64_t>(x));
      case GgufValueType::INT64: return GgufMetaValue::i64(x);
      default: return Status::errorf("an integer key of type {}", gguf_value_type_name(v.type));
    }
  };
  const std::pair<std::string, int64_t> ints[] = {
      {a + "block_count", to.trunk + nextn},      {a + "embedding_length", to.embd},
      {a + "feed_forward_length", to.ffn},        {a + "attention.head_count", to.heads},
      {a + "ssm.time_step_rank", to.v_heads},     {a + "ssm.inner_size", to.v_heads * to.v_dim}};
  for (const auto& [key, value] : in->metadata()) {
    GgufMetaValue v = GgufMetaValue::from(value);
    for (const auto& [k, x] : ints) {
      if (key != k) continue;
      HS_ASSIGN_OR_RETURN(v, same_type(value, x));
    }
    if (key == a + "attention.recurrent_layers") {
      if (value.type != GgufValueType::ARRAY || value.elem_type != GgufValueType::BOOL)
        return Status::errorf("{}: {} is not an array of bools", in_path, key);
      std::vector<GgufMetaValue> flags;
      for (int64_t b = 0; b < to.trunk + nextn; ++b) flags.push_back(GgufMetaValue::boolean(qwen35_recurrent(b, to)));
      v = GgufMetaValue::array(GgufValueType::BOOL, std::move(flags));
    }
    HS_RETURN_IF_ERROR(w.set(key, std::move(v)));
  }
  for (ShapedTensor& t : tensors) HS_RETURN_IF_ERROR(w.add_tensor_shape(t.name, t.type, std::move(t.ne)));
  HS_RETURN_IF_ERROR(w.write_skeleton(out));
  std::fprintf(stderr, "%s: %s at %lld x %lld, %lld layers, %lld heads, %lld GDN value heads (%zu tensors)\n", out.c_str(),
               in_path.c_str(), static_cast<long long>(to.embd), static_cast<long long>(to.ffn),
               static_cast<long long>(to.trunk), static_cast<long long>(to.heads), static_cast<long long>(to.v_heads),
               tensors.size());
  return Status::ok();
}

Status dflash_for(const std::string& target_path, const std::string& out, int layers) {
  HS_ASSIGN_OR_RETURN(auto target, GgufFile::open(target_path));
  HS_ASSIGN_OR_RETURN(std::string_view arch_view, target->get_string("general.architecture"));
  const std::string arch(arch_view);
  HS_ASSIGN_OR_RETURN(int64_t E, target->get_int(arch + ".embedding_length"));
  HS_ASSIGN_OR_RETURN(int64_t F, target->get_int(arch + ".feed_forward_length"));
  HS_ASSIGN_OR_RETURN(int64_t blocks, target->get_int(arch + ".block_count"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, target->get_int_or(arch + ".nextn_predict_layers", 0));
  HS_ASSIGN_OR_RETURN(int64_t eos, target->get_int_or("tokenizer.ggml.eos_token_id", 0));
  const int64_t H = 32, Hkv = 8, D = 128, taps = 5, trunk = blocks - nextn;
  if (layers <= 0 || E % D != 0 || trunk < taps)
    return Status::errorf("{}: no DFlash shape for this target", target_path);
  std::vector<int32_t> tap_ids;  // inputs of layers spread over the trunk
  for (int64_t t = 0; t < taps; ++t) tap_ids.push_back(static_cast<int32_t>(1 + t * (trunk - 2) / (taps - 1)));
  GgufWriter w;
  auto u32 = [](int64_t v) { return GgufMetaValue::u32(static_cast<uint32_t>(v)); };
  HS_RETURN_IF_ERROR(w.set("general.architecture", GgufMetaValue::string("dflash")));
  HS_RETURN_IF_ERROR(w.set("dflash.block_count", u32(layers)));
  HS_RETURN_IF_ERROR(w.set("dflash.context_length", u32(32768)));
  HS_RETURN_IF_ERROR(w.set("dflash.embedding_length", u32(E)));
  HS_RETURN_IF_ERROR(w.set("dflash.feed_forward_length", u32(F)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.head_count", u32(H)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.head_count_kv", u32(Hkv)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.key_length", u32(D)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.value_length", u32(D)));
  HS_RETURN_IF_ERROR(w.set("dflash.rope.freq_base", GgufMetaValue::f32(1e7f)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.layer_norm_rms_epsilon", GgufMetaValue::f32(1e-6f)));
  HS_RETURN_IF_ERROR(w.set("dflash.block_size", u32(16)));
  HS_RETURN_IF_ERROR(w.set("dflash.target_layers", GgufMetaValue::i32_array(tap_ids)));
  const int32_t half = static_cast<int32_t>(D / 2);  // plain positions (DFLASH.md)
  HS_RETURN_IF_ERROR(w.set("dflash.rope.dimension_sections", GgufMetaValue::i32_array({half, 0, 0, 0})));
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.mask_token_id", u32(eos)));
  const GgmlType q = GgmlType::Q8_0, f = GgmlType::F32;
  HS_RETURN_IF_ERROR(w.add_tensor_shape("fc.weight", q, {taps * E, E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape("enc.output_norm.weight", f, {E}));
  for (int i = 0; i < layers; ++i) {
    auto t = [&](const char* name, GgmlType type, std::vector<int64_t> ne) {
      return w.add_tensor_shape(fmt::format("blk.{}.{}.weight", i, name), type, std::move(ne));
    };
    HS_RETURN_IF_ERROR(t("attn_norm", f, {E}));
    HS_RETURN_IF_ERROR(t("attn_q", q, {E, H * D}));
    HS_RETURN_IF_ERROR(t("attn_k", q, {E, Hkv * D}));
    HS_RETURN_IF_ERROR(t("attn_v", q, {E, Hkv * D}));
    HS_RETURN_IF_ERROR(t("attn_output", q, {H * D, E}));
    HS_RETURN_IF_ERROR(t("attn_q_norm", f, {D}));
    HS_RETURN_IF_ERROR(t("attn_k_norm", f, {D}));
    HS_RETURN_IF_ERROR(t("ffn_norm", f, {E}));
    HS_RETURN_IF_ERROR(t("ffn_gate", q, {E, F}));
    HS_RETURN_IF_ERROR(t("ffn_up", q, {E, F}));
    HS_RETURN_IF_ERROR(t("ffn_down", q, {F, E}));
  }
  HS_RETURN_IF_ERROR(w.add_tensor_shape("output_norm.weight", f, {E}));
  HS_RETURN_IF_ERROR(w.write_skeleton(out));
  std::fprintf(stderr, "%s: a %d-layer DFlash drafter for %s\n", out.c_str(), layers, target_path.c_str());
  return Status::ok();
}

Status fill(const std::string& path, uint64_t seed) {
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return Status::errorf("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return Status::errorf("{}: empty or unreadable", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status::errorf("{}: mmap failed: {}", path, std::strerror(errno));
  uint8_t* base = static_cast<uint8_t*>(p);
  Status s = [&]() -> Status {
    HS_ASSIGN_OR_RETURN(auto file, GgufFile::parse(base, size, path));
    // Tensors on all cores (each seeded by its name, so the bytes do not depend on the order): a device
    // call fills the 9B in a few seconds instead of ~20.
    const auto& tensors = file->tensors();
    std::vector<Status> errors(tensors.size(), Status::ok());
    ThreadPool(0).parallel_for(static_cast<int64_t>(tensors.size()), [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i)
        errors[i] = fill_tensor(tensors[i], const_cast<uint8_t*>(tensors[i].data), seed);  // a view of our writable map
    });
    for (const Status& e : errors) HS_RETURN_IF_ERROR(e);
    std::fprintf(stderr, "%s: %zu tensors filled (seed %llu)\n", path.c_str(), file->tensors().size(),
                 static_cast<unsigned long long>(seed));
    return Status::ok();
  }();
  if (::munmap(p, size) != 0 && s.is_ok()) s = Status::errorf("{}: munmap failed", path);
  return s;
}

}  // namespace
}  // namespace hyspec

int main(int argc, char** argv) {
  using hyspec::Status;
  const std::string mode = argc > 1 ? argv[1] : "";
  Status s = Status::error(
      "usage: gguf_skeleton skeleton IN.gguf OUT.gguf | fill FILE.gguf [SEED] | add-nextn IN.gguf OUT.gguf | "
      "dflash-for TARGET.gguf OUT.gguf [LAYERS] | resize IN.gguf OUT.gguf EMBD FFN LAYERS HEADS V_HEADS");
  if (mode == "skeleton" && argc == 4) s = hyspec::skeleton(argv[2], argv[3]);
  if (mode == "add-nextn" && argc == 4) s = hyspec::add_nextn(argv[2], argv[3]);
  if (mode == "dflash-for" && (argc == 4 || argc == 5))
    s = hyspec::dflash_for(argv[2], argv[3], argc == 5 ? std::atoi(argv[4]) : 5);
  if (mode == "resize" && argc == 9) {
    auto num = [&](int i) { return std::strtoll(argv[i], nullptr, 10); };
    hyspec::Qwen35Shape to{};
    to.embd = num(4), to.ffn = num(5), to.trunk = num(6), to.heads = num(7), to.v_heads = num(8);
    s = hyspec::resize(argv[2], argv[3], to);
  }
  if (mode == "fill" && (argc == 3 || argc == 4)) s = hyspec::fill(argv[2], argc == 4 ? std::strtoull(argv[3], nullptr, 10) : 1);
  if (s.is_ok()) return 0;
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 1;
}
