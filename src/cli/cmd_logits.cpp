// hyspec logits: raw little-endian f32 logits [n_tokens, n_vocab] of one prefill, for parity checks
// against other engines.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"

namespace hyspec::cli {

void register_logits(CLI::App& app, int& exit_code) {
  struct Flags {
    EngineFlags engine;
    std::string tokens, out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("logits", "Write the logits of one prefill as raw f32 [n_tokens, n_vocab]");
  f->engine.add_to(*cmd, false);
  cmd->add_option("--tokens", f->tokens, "Comma-separated token ids")->required();
  cmd->add_option("--out,-o", f->out, "Output file")->required();
  cmd->callback([f, &exit_code] {
    std::vector<int32_t> ids;
    std::stringstream ss(f->tokens);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0') {
        exit_code = fail(Status::errorf("--tokens: '{}' is not a token id", item));
        return;
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    auto config = f->engine.to_config();
    if (!config) {
      exit_code = fail(config.status());
      return;
    }
    if (config->n_ctx == 0) config->n_ctx = static_cast<int64_t>(ids.size()) + 1;
    auto engine = Engine::create(*config);
    if (!engine) {
      exit_code = fail(engine.status());
      return;
    }
    auto logits = (*engine)->prompt_logits(ids, true);
    if (!logits) {
      exit_code = fail(logits.status());
      return;
    }
    std::ofstream out(f->out, std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits->data()), static_cast<std::streamsize>(logits->size() * sizeof(float)));
    if (!out) {
      exit_code = fail(Status::errorf("{}: cannot write", f->out));
      return;
    }
    std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), (*engine)->model().hparams().n_vocab, f->out.c_str());
    exit_code = 0;
  });
}

}  // namespace hyspec::cli
