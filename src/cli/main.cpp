// hyspec: run, chat, serve, bench, info, tokenize, logits, convert.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"hyspec: fast lossless speculative decoding for hybrid linear-attention models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hyspec 0.1.0");
  int exit_code = 0;
  hyspec::cli::register_info(app, exit_code);
  hyspec::cli::register_run(app, exit_code);
  hyspec::cli::register_logits(app, exit_code);
  hyspec::cli::register_bench(app, exit_code);
  hyspec::cli::register_tokenize(app, exit_code);
  hyspec::cli::register_serve(app, exit_code);
  hyspec::cli::register_convert(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
