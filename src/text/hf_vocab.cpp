#include "text/hf_vocab.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "format/json_file.h"
#include "text/tokenizer.h"
#include "util/mmap_file.h"

namespace hyspec {

namespace {

using nlohmann::json;

// The qwen35 pre-tokenizer regex as HF tokenizer.json spells it (QWEN35.md).
constexpr const char* kQwen35HfPattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kSpecialTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};

Result<std::optional<json>> read_json_if_present(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::optional<json>();
  HS_ASSIGN_OR_RETURN(json j, read_json_object(path));
  return std::optional<json>(std::move(j));
}

Status check_qwen35_pretokenizer(const json& tok, const std::string& path) {
  const Status unsupported = Status::errorf(
      "{}: the pre-tokenizer is not qwen35's (Split on the qwen35 regex, then ByteLevel without its own "
      "regex); hyspec reads only qwen35 byte-level BPE vocabularies",
      path);
  if (!tok.contains("pre_tokenizer") || !tok["pre_tokenizer"].is_object()) return unsupported;
  const json& pre = tok["pre_tokenizer"];
  if (pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers") || !pre["pretokenizers"].is_array() ||
      pre["pretokenizers"].size() != 2)
    return unsupported;
  const json& split = pre["pretokenizers"][0];
  const json& bytes = pre["pretokenizers"][1];
  if (!split.is_object() || split.value("type", "") != "Split" || !split.contains("pattern") ||
      !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
      split["pattern"]["Regex"] != kQwen35HfPattern || split.value("invert", false))
    return unsupported;
  if (!bytes.is_object() || bytes.value("type", "") != "ByteLevel" || bytes.value("use_regex", true) ||
      bytes.value("add_prefix_space", false))
    return unsupported;
  return Status::ok();
}

// llama.cpp's heuristic for added tokens that should be CONTROL although not marked special.
bool looks_special(const std::string& t) {
  auto wraps = [&](const std::string& open, const std::string& close) {
    return t.size() >= open.size() + close.size() && t.compare(0, open.size(), open) == 0 &&
           t.compare(t.size() - close.size(), close.size(), close) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wraps("<unused", ">");
}

}  // namespace

Status add_hf_vocab(const std::string& dir, int64_t n_vocab, GgufWriter& w) {
  const std::string tok_path = dir + "/tokenizer.json";
  HS_ASSIGN_OR_RETURN(std::optional<json> tok_json, read_json_if_present(tok_path));
  if (!tok_json) return Status::errorf("{}: no tokenizer.json (give the directory that holds it)", dir);
  const json& tok = *tok_json;
  const json* model = tok.contains("model") && tok["model"].is_object() ? &tok["model"] : nullptr;
  if (!model || model->value("type", "BPE") != "BPE" || !model->contains("vocab") || !(*model)["vocab"].is_object())
    return Status::errorf("{}: not a BPE tokenizer with a vocabulary", tok_path);
  HS_RETURN_IF_ERROR(check_qwen35_pretokenizer(tok, tok_path));

  // id -> text over the BPE vocabulary and the added tokens.
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : (*model)["vocab"].items()) {
    if (!id.is_number_integer()) return Status::errorf("{}: vocab['{}'] is not an id", tok_path, text);
    by_id[id.get<int64_t>()] = text;
  }
  struct Added {
    std::string content;
    bool special = false;
  };
  std::map<int64_t, Added> added;
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& a : tok["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return Status::errorf("{}: an added_tokens entry without id and content: {}", tok_path, a.dump());
      const int64_t id = a["id"].get<int64_t>();
      added[id] = {a["content"].get<std::string>(), a.value("special", false)};
      by_id[id] = added[id].content;
    }
  }
  if (by_id.empty()) return Status::errorf("{}: the vocabulary is empty", tok_path);
  if (n_vocab <= 0) n_vocab = by_id.rbegin()->first + 1;
  if (by_id.begin()->first < 0 || by_id.rbegin()->first >= n_vocab)
    return Status::errorf("{}: token id {} is outside the model's vocabulary of {}", tok_path,
                          by_id.begin()->first < 0 ? by_id.begin()->first : by_id.rbegin()->first, n_vocab);

  std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
  std::vector<int32_t> types(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = static_cast<int32_t>(TokenType::Unused);
      continue;
    }
    tokens[i] = it->second;
    auto a = added.find(i);
    if (a == added.end())
      types[i] = static_cast<int32_t>(TokenType::Normal);
    else
      types[i] = static_cast<int32_t>(a->second.special || looks_special(a->second.content) ? TokenType::Control
                                                                                              : TokenType::UserDefined);
  }
  std::vector<std::string> merges;
  if (model->contains("merges") && (*model)["merges"].is_array()) {
    for (const json& m : (*model)["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        return Status::errorf("{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", tok_path, m.dump());
      }
    }
  }
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.model", GgufMetaValue::string("gpt2")));
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.pre", GgufMetaValue::string("qwen35")));
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.tokens", GgufMetaValue::string_array(tokens)));
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.token_type", GgufMetaValue::i32_array(types)));
  if (!merges.empty()) HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.merges", GgufMetaValue::string_array(merges)));

  // Special ids: tokenizer_config.json first, then config.json for the types still unset.
  HS_ASSIGN_OR_RETURN(std::optional<json> tcfg, read_json_if_present(dir + "/tokenizer_config.json"));
  HS_ASSIGN_OR_RETURN(std::optional<json> cfg, read_json_if_present(dir + "/config.json"));
  std::vector<std::pair<std::string, int64_t>> special;
  auto set_special = [&](const std::string& type, int64_t id) {
    for (const auto& s : special)
      if (s.first == type) return;
    if (id >= 0 && id < n_vocab) special.emplace_back(type, id);
  };
  if (tcfg) {
    for (const char* type : kSpecialTypes) {
      const std::string key = std::string(type) + "_token";
      if (!tcfg->contains(key)) continue;
      const json& entry = (*tcfg)[key];
      std::string content;
      if (entry.is_string())
        content = entry.get<std::string>();
      else if (entry.is_object() && entry.contains("content") && entry["content"].is_string())
        content = entry["content"].get<std::string>();
      else
        continue;
      for (const auto& [id, a] : added)
        if (a.content == content) {
          set_special(type, id);
          break;
        }
    }
  }
  if (cfg) {
    for (const char* type : kSpecialTypes) {
      const std::string key = std::string(type) + "_token_id";
      if (!cfg->contains(key)) continue;
      const json& v = (*cfg)[key];
      if (v.is_number_integer()) set_special(type, v.get<int64_t>());
      else if (v.is_array() && !v.empty() && v[0].is_number_integer()) set_special(type, v[0].get<int64_t>());
    }
  }
  for (const auto& [type, id] : special) {
    const std::string key = type == "pad" ? "tokenizer.ggml.padding_token_id" : "tokenizer.ggml." + type + "_token_id";
    HS_RETURN_IF_ERROR(w.set(key, GgufMetaValue::u32(static_cast<uint32_t>(id))));
  }
  if (tcfg) {
    for (const char* type : kSpecialTypes) {
      const std::string key = std::string("add_") + type + "_token";
      if (tcfg->contains(key) && (*tcfg)[key].is_boolean())
        HS_RETURN_IF_ERROR(w.set("tokenizer.ggml." + key, GgufMetaValue::boolean((*tcfg)[key].get<bool>())));
    }
  }

  std::string chat_template;
  if (tcfg && tcfg->contains("chat_template")) {
    const json& t = (*tcfg)["chat_template"];
    if (!t.is_string())
      return Status::errorf("{}/tokenizer_config.json: chat_template is not one string (named templates are not "
                            "converted)",
                            dir);
    chat_template = t.get<std::string>();
  } else if (std::filesystem::exists(dir + "/chat_template.jinja")) {
    HS_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(dir + "/chat_template.jinja"));
    chat_template.assign(reinterpret_cast<const char*>(f.data()), f.size());
  }
  if (!chat_template.empty())
    HS_RETURN_IF_ERROR(w.set("tokenizer.chat_template", GgufMetaValue::string(chat_template)));
  return Status::ok();
}

}  // namespace hyspec
