// `hyspec tokenize MODEL.gguf TEXT`: the token ids of TEXT under the model's vocabulary, one
// `id  'piece'` line per token (control bytes and bytes that are not UTF-8 escaped) and a count;
// `--ids` prints only the ids; `--no-special` reads "<|im_start|>" etc. as plain text.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace hyspec::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool ids_only = false;
  bool no_special = false;
};

// The piece as a quoted-string body: valid UTF-8 as is; \n, \t, \r, \\, \' and other control or
// invalid bytes escaped, so a piece holding part of a character shows its bytes.
std::string escape_piece(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    int32_t cp;
    const size_t n = utf8_decode(bytes, i, cp);
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (cp < 0 || cp < 0x20 || cp == 0x7F) {
      switch (b) {
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default: out += fmt::format("\\x{:02x}", b);
      }
    } else if (b == '\\' || b == '\'') {
      out += '\\';
      out += static_cast<char>(b);
    } else {
      out.append(bytes.substr(i, n));
    }
    i += n;
  }
  return out;
}

int run_tokenize(const TokenizeOptions& opt) {
  auto gguf = GgufFile::open(opt.model);
  if (!gguf) {
    fmt::print(stderr, "error: {}\n", gguf.message());
    return 1;
  }
  auto tokenizer = Tokenizer::from_gguf(**gguf);
  if (!tokenizer) {
    fmt::print(stderr, "error: {}\n", tokenizer.message());
    return 1;
  }
  const std::vector<int32_t> ids = (*tokenizer)->encode(opt.text, !opt.no_special);
  if (opt.ids_only) {
    fmt::print("{}\n", fmt::join(ids, " "));
    return 0;
  }
  for (int32_t id : ids) fmt::print("{}  '{}'\n", id, escape_piece((*tokenizer)->bytes_view(id)));
  fmt::print("{} tokens\n", ids.size());
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the tokens of a text under a model's vocabulary");
  cmd->add_option("model", opt->model, "GGUF file (a model or a vocabulary-only file)")->required();
  cmd->add_option("text", opt->text, "the text to tokenize")->required();
  cmd->add_flag("--ids", opt->ids_only, "print only the ids, space-separated on one line");
  cmd->add_flag("--no-special", opt->no_special, "read special-token text such as <|im_start|> as plain text");
  cmd->callback([opt, &exit_code] { exit_code = run_tokenize(*opt); });
}

}  // namespace hyspec::cli
