// Byte-level BPE tokenizer of a Qwen3.5 GGUF (tokenizer.ggml.model = gpt2, tokenizer.ggml.pre =
// qwen35). encode(text, parse_special=true) produces what HF tokenizers' encode(text,
// add_special_tokens=False) produces (HF matches added tokens in the text by default; Qwen's have no
// lstrip/rstrip/single_word flags); parse_special=false is HF's split_special_tokens=True. No BOS
// is ever added. Loaded once, then immutable: every const method may be called from any number of
// threads at once. The Tokenizer owns copies of what it needs; the GgufFile may be closed after
// from_gguf().
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe.h"
#include "util/status.h"

namespace hyspec {

class GgufFile;
class Pretokenizer;
class BpeCache;

// tokenizer.ggml.token_type values (llama.cpp's numbering).
enum class TokenType : uint8_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,      // <|im_start|>, <|endoftext|>, ...
  UserDefined = 4,  // added tokens that are not marked special
  Unused = 5,
  Byte = 6,
};

class Tokenizer {
 public:
  // Errors name the file and the tokenizer.ggml.* key: missing or mistyped keys, an unsupported
  // model or pre-tokenizer, array lengths that disagree, merges naming unknown tokens, a byte
  // without a token, special ids out of range.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& gguf);
  ~Tokenizer();

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte-wise, never rejected). With
  // parse_special, the text of a control or user-defined token (e.g. "<|im_start|>") becomes that
  // token, longest match first; without it every byte is plain text.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // The bytes of the tokens, concatenated (special tokens give their text). Ids out of range give
  // nothing. For parse_special=false, decode(encode(s)) == s for every byte string s.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t n_vocab() const { return static_cast<int32_t>(types_.size()); }
  // The vocabulary entry as stored (byte-level text, e.g. "Ġworld"); "" for an id out of range.
  std::string_view token_text(int32_t id) const;
  // The raw bytes the token stands for (" world"); may be part of a UTF-8 character.
  std::string token_bytes(int32_t id) const { return std::string(bytes_view(id)); }
  std::string_view bytes_view(int32_t id) const;  // same, as a view valid while the Tokenizer lives
  TokenType token_type(int32_t id) const;
  // The id of the vocabulary entry whose stored text is exactly `text`.
  std::optional<int32_t> find_token(std::string_view text) const;

  std::optional<int32_t> bos_id() const { return bos_; }
  std::optional<int32_t> eos_id() const { return eos_; }
  std::optional<int32_t> eot_id() const { return eot_; }
  std::optional<int32_t> pad_id() const { return pad_; }
  std::optional<int32_t> mask_id() const { return mask_; }

  // Generation stops at eos, eot, <|im_end|> and <|endoftext|> (those the vocabulary has).
  bool is_end_of_generation(int32_t id) const;
  bool is_control(int32_t id) const { return token_type(id) == TokenType::Control; }

 private:
  Tokenizer();
  Status load(const GgufFile& gguf);
  void build_text_index();
  struct EncodeScratch;
  void encode_plain(std::string_view text, EncodeScratch& scratch, std::vector<int32_t>& out) const;

  std::string text_arena_;              // token_text of all ids, concatenated
  std::vector<uint32_t> text_offsets_;  // [n_vocab + 1]
  std::string bytes_arena_;             // token bytes of all ids, concatenated
  std::vector<uint32_t> bytes_offsets_;  // [n_vocab + 1]
  std::vector<TokenType> types_;        // [n_vocab]
  // Open-addressing index token_text -> id: (hash >> 32) << 32 | id per slot, kNoSlot if empty.
  // The lowest id wins when two entries have the same text.
  std::vector<uint64_t> text_index_;
  int32_t byte_token_[256] = {};
  MergeTable merges_;
  std::unique_ptr<Pretokenizer> pretokenizer_;
  std::unique_ptr<BpeCache> cache_;

  // Specials matched by parse_special, grouped by first byte, longest first.
  std::vector<std::vector<int32_t>> specials_by_first_byte_;  // [256]
  std::vector<int32_t> end_of_generation_;
  std::optional<int32_t> bos_, eos_, eot_, pad_, mask_;
};

// Turns a stream of token ids into UTF-8 text as it arrives: push() returns the bytes that became
// complete, holding back a trailing partial character until the tokens that finish it arrive;
// flush() returns whatever is held (then possibly a partial character). Invalid byte sequences are
// passed through as soon as they are known to be invalid. One instance per stream; the Tokenizer
// must outlive it.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace hyspec
