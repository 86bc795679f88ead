// `hyspec convert HF_DIR OUT.gguf [--type f32|f16|bf16|q8_0] [--tokenizer DIR] [--name NAME]`: a
// Hugging Face checkpoint (Qwen3_5ForCausalLM with its MTP block, or a z-lab DFlashDraftModel) to the
// GGUF llama.cpp's converter writes (model/hf_convert.h for the tensors and hyperparameters,
// text/hf_vocab.h for the vocabulary).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "model/hf_convert.h"
#include "text/hf_vocab.h"

namespace hyspec::cli {
namespace {

struct ConvertFlags {
  std::string dir, out, type = "f32", tokenizer, name;
};

Status convert(const ConvertFlags& f) {
  HfConvertOptions o;
  HS_ASSIGN_OR_RETURN(o.type, parse_convert_type(f.type));
  o.name = f.name;
  HS_ASSIGN_OR_RETURN(HfConversion c, convert_hf_model(f.dir, o));
  std::string vocab_dir = f.tokenizer.empty() ? f.dir : f.tokenizer;
  if (c.vocab_from_target && f.tokenizer.empty())
    return Status::errorf("{}: a DFlash drafter ships no tokenizer: give the target's directory with --tokenizer",
                          f.dir);
  HS_RETURN_IF_ERROR(add_hf_vocab(vocab_dir, c.n_vocab, c.writer));
  for (auto& [key, value] : c.after_vocab) HS_RETURN_IF_ERROR(c.writer.set(key, std::move(value)));
  HS_RETURN_IF_ERROR(c.writer.write_file(f.out));
  std::fprintf(stderr, "%s: %s, %lld parameters (%s) -> %s\n", f.dir.c_str(), c.arch.c_str(),
               static_cast<long long>(c.n_params), gguf_size_label(c.n_params).c_str(), f.out.c_str());
  return Status::ok();
}

}  // namespace

void register_convert(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ConvertFlags>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert a Hugging Face checkpoint (Qwen3_5ForCausalLM, DFlashDraftModel) to GGUF");
  cmd->add_option("hf_dir", f->dir, "Directory with config.json and the safetensors weights")->required();
  cmd->add_option("out", f->out, "GGUF file to write")->required();
  cmd->add_option("--type", f->type, "Type of the weight matrices")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--tokenizer", f->tokenizer,
                  "Directory with tokenizer.json (default: hf_dir; a DFlash drafter needs its target's)");
  cmd->add_option("--name", f->name, "general.name (default: the directory's name)");
  cmd->callback([f, &exit_code] {
    const Status st = convert(*f);
    exit_code = st.is_ok() ? 0 : fail(st);
  });
}

}  // namespace hyspec::cli
