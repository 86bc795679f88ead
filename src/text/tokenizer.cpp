#include "text/tokenizer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "format/gguf.h"
#include "text/bpe_cache.h"
#include "text/byte_level.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace hyspec {

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& gguf) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  HS_RETURN_IF_ERROR(t->load(gguf));
  return t;
}

Status Tokenizer::load(const GgufFile& gguf) {
  const std::string& fn = gguf.path();
  HS_ASSIGN_OR_RETURN(const std::string_view model, gguf.get_string("tokenizer.ggml.model"));
  if (model != "gpt2")
    return Status::errorf("{}: tokenizer.ggml.model is '{}', hyspec supports only 'gpt2' (byte-level BPE)", fn, model);
  HS_ASSIGN_OR_RETURN(const std::string_view pre, gguf.get_string("tokenizer.ggml.pre"));
  if (pre != "qwen35")
    return Status::errorf("{}: tokenizer.ggml.pre is '{}', hyspec supports only 'qwen35'", fn, pre);

  HS_ASSIGN_OR_RETURN(const std::vector<std::string_view> tokens, gguf.get_string_array("tokenizer.ggml.tokens"));
  if (tokens.empty()) return Status::errorf("{}: tokenizer.ggml.tokens is empty", fn);
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2))
    return Status::errorf("{}: tokenizer.ggml.tokens has {} entries, too many", fn, tokens.size());
  const int32_t n = static_cast<int32_t>(tokens.size());

  types_.assign(n, TokenType::Normal);
  if (gguf.has("tokenizer.ggml.token_type")) {
    HS_ASSIGN_OR_RETURN(const std::vector<int64_t> types, gguf.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size())
      return Status::errorf("{}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", fn,
                            types.size(), tokens.size());
    for (int32_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::Byte))
        return Status::errorf("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", fn, i, types[i]);
      types_[i] = static_cast<TokenType>(types[i]);
    }
  }

  // Stored text and raw bytes of every token. Control and user-defined tokens are stored as their
  // literal text; the others in the byte-level alphabet.
  size_t text_total = 0;
  for (std::string_view t : tokens) text_total += t.size();
  if (text_total >= std::numeric_limits<uint32_t>::max() / 2)
    return Status::errorf("{}: tokenizer.ggml.tokens holds {} bytes of text, too many", fn, text_total);
  text_arena_.reserve(text_total);
  bytes_arena_.reserve(text_total);
  text_offsets_.assign(1, 0);
  bytes_offsets_.assign(1, 0);
  for (int32_t i = 0; i < n; ++i) {
    text_arena_.append(tokens[i]);
    text_offsets_.push_back(static_cast<uint32_t>(text_arena_.size()));
    if (types_[i] == TokenType::Control || types_[i] == TokenType::UserDefined)
      bytes_arena_.append(tokens[i]);
    else
      byte_level_decode(tokens[i], bytes_arena_);  // text outside the alphabet stays as it is
    bytes_offsets_.push_back(static_cast<uint32_t>(bytes_arena_.size()));
  }
  build_text_index();

  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    std::string text;
    byte_level_encode(std::string_view(&byte, 1), text);
    const std::optional<int32_t> id = find_token(text);
    if (!id) return Status::errorf("{}: tokenizer.ggml.tokens has no token for byte 0x{:02x} ('{}')", fn, b, text);
    byte_token_[b] = *id;
  }

  HS_ASSIGN_OR_RETURN(const std::vector<std::string_view> merges, gguf.get_string_array("tokenizer.ggml.merges"));
  std::vector<MergeTable::Rule> rules;
  rules.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string_view m = merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string_view::npos || space + 1 >= m.size())
      return Status::errorf("{}: tokenizer.ggml.merges[{}] = '{}' is not of the form 'A B'", fn, i, m);
    const std::string_view a = m.substr(0, space), b = m.substr(space + 1);
    joined.assign(a).append(b);
    const std::optional<int32_t> ia = find_token(a), ib = find_token(b), ij = find_token(joined);
    if (!ia || !ib || !ij)
      return Status::errorf("{}: tokenizer.ggml.merges[{}] = '{}': '{}' is not in tokenizer.ggml.tokens", fn, i, m,
                            !ia ? a : !ib ? b : std::string_view(joined));
    rules.push_back({*ia, *ib, *ij});
  }
  merges_ = MergeTable(rules);

  specials_by_first_byte_.assign(256, {});
  for (int32_t i = 0; i < n; ++i) {
    if ((types_[i] == TokenType::Control || types_[i] == TokenType::UserDefined) && !token_text(i).empty())
      specials_by_first_byte_[static_cast<uint8_t>(token_text(i)[0])].push_back(i);
  }
  for (auto& list : specials_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [&](int32_t a, int32_t b) { return token_text(a).size() > token_text(b).size(); });
  }

  struct SpecialKey {
    const char* key;
    std::optional<int32_t>* id;
  };
  for (const SpecialKey& k : {SpecialKey{"tokenizer.ggml.bos_token_id", &bos_},
                              SpecialKey{"tokenizer.ggml.eos_token_id", &eos_},
                              SpecialKey{"tokenizer.ggml.eot_token_id", &eot_},
                              SpecialKey{"tokenizer.ggml.padding_token_id", &pad_},
                              SpecialKey{"tokenizer.ggml.mask_token_id", &mask_}}) {
    if (!gguf.has(k.key)) continue;
    HS_ASSIGN_OR_RETURN(const int64_t id, gguf.get_int(k.key));
    if (id < 0 || id >= n) return Status::errorf("{}: {} = {} is outside the vocabulary [0, {})", fn, k.key, id, n);
    *k.id = static_cast<int32_t>(id);
  }
  for (std::optional<int32_t> id : {eos_, eot_, find_token("<|im_end|>"), find_token("<|endoftext|>")}) {
    if (id && std::find(end_of_generation_.begin(), end_of_generation_.end(), *id) == end_of_generation_.end())
      end_of_generation_.push_back(*id);
  }

  HS_ASSIGN_OR_RETURN(pretokenizer_, Pretokenizer::create(Pretokenizer::kQwen35Pattern));
  cache_ = std::make_unique<BpeCache>();
  return Status::ok();
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return std::string_view(text_arena_).substr(text_offsets_[id], text_offsets_[id + 1] - text_offsets_[id]);
}

std::string_view Tokenizer::bytes_view(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return std::string_view(bytes_arena_).substr(bytes_offsets_[id], bytes_offsets_[id + 1] - bytes_offsets_[id]);
}

TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? types_[id] : TokenType::Undefined;
}

namespace {
constexpr uint64_t kNoSlot = ~uint64_t{0};
uint64_t text_hash(std::string_view s) { return std::hash<std::string_view>{}(s) * 0x9E3779B97F4A7C15ull; }
}  // namespace

void Tokenizer::build_text_index() {
  size_t capacity = 16;
  while (capacity < types_.size() * 2) capacity *= 2;
  text_index_.assign(capacity, kNoSlot);
  const size_t mask = capacity - 1;
  for (int32_t id = 0; id < n_vocab(); ++id) {
    const std::string_view text = token_text(id);
    const uint64_t h = text_hash(text);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const uint64_t slot = text_index_[i];
      if (slot == kNoSlot) {
        text_index_[i] = (h & 0xFFFFFFFF00000000ull) | uint32_t(id);
        break;
      }
      if ((slot >> 32) == (h >> 32) && token_text(int32_t(slot & 0xFFFFFFFFu)) == text) break;  // keep lower id
    }
  }
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const size_t mask = text_index_.size() - 1;
  const uint64_t h = text_hash(text);
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint64_t slot = text_index_[i];
    if (slot == kNoSlot) return std::nullopt;
    const auto id = int32_t(slot & 0xFFFFFFFFu);
    if ((slot >> 32) == (h >> 32) && token_text(id) == text) return id;
  }
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(end_of_generation_.begin(), end_of_generation_.end(), id) != end_of_generation_.end();
}

// Buffers reused across the segments and pieces of one encode() call.
struct Tokenizer::EncodeScratch {
  std::vector<std::string_view> pieces;
  std::vector<int32_t> ids;
  MergeTable::Scratch merge;
};

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  EncodeScratch scratch;
  if (!parse_special) {
    encode_plain(text, scratch, out);
    return out;
  }
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t match = -1;
    for (int32_t id : specials_by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if (text.substr(i).starts_with(token_text(id))) {
        match = id;
        break;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_start, i - plain_start), scratch, out);
    out.push_back(match);
    i += token_text(match).size();
    plain_start = i;
  }
  encode_plain(text.substr(plain_start), scratch, out);
  return out;
}

void Tokenizer::encode_plain(std::string_view text, EncodeScratch& scratch, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  pretokenizer_->split(text, scratch.pieces);
  std::vector<int32_t>& ids = scratch.ids;
  for (std::string_view piece : scratch.pieces) {
    // One- and two-byte pieces (punctuation, digits, spaces) merge faster than a cache lookup.
    const bool cacheable = piece.size() > 2;
    if (cacheable && cache_->lookup(piece, out)) continue;
    ids.clear();
    for (char c : piece) ids.push_back(byte_token_[static_cast<uint8_t>(c)]);
    merges_.merge(ids, scratch.merge);
    if (cacheable) cache_->insert(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out.append(bytes_view(id));
  return out;
}

std::string TokenStreamDecoder::push(int32_t id) {
  pending_.append(tokenizer_.bytes_view(id));
  const size_t complete = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return out;
}

std::string TokenStreamDecoder::flush() { return std::exchange(pending_, std::string()); }

}  // namespace hyspec
