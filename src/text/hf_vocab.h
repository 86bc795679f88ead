// The vocabulary of a Hugging Face tokenizer directory written as GGUF metadata, the way llama.cpp's
// converter writes a byte-level BPE vocabulary (its gpt2 path), for tokenizers with the qwen35
// pre-tokenizer (QWEN35.md) — the only kind hyspec's Tokenizer reads:
//   tokenizer.ggml.model = gpt2, .pre = qwen35;
//   .tokens: ids 0..n_vocab-1 from the BPE vocabulary and the added tokens, "[PAD<id>]" where no
//     token has the id; .token_type: CONTROL for special added tokens and added tokens that look
//     special (<|...|>), USER_DEFINED for other added tokens, UNUSED for the padding, else NORMAL;
//   .merges as "a b";
//   .<bos|eos|unk|sep|pad|cls|mask>_token_id: from tokenizer_config.json's *_token (matched against
//     the added tokens), then config.json's *_token_id for the ones still unset, in the order set;
//   .add_<type>_token from tokenizer_config.json's add_<type>_token booleans;
//   tokenizer.chat_template from tokenizer_config.json's chat_template or chat_template.jinja.
#pragma once
#include <cstdint>
#include <string>

#include "format/gguf_writer.h"
#include "util/status.h"

namespace hyspec {

// Appends the keys above to `w`; dir holds tokenizer.json (and optionally tokenizer_config.json,
// config.json, chat_template.jinja). n_vocab: the model's embedding rows (config vocab_size).
Status add_hf_vocab(const std::string& dir, int64_t n_vocab, GgufWriter& w);

}  // namespace hyspec
