// The `hyspec` subcommands. Each registers itself on the CLI11 app; its callback stores the exit
// code in `exit_code` (library errors are printed as one line "error: ..." and give 1).
#pragma once
#include <CLI/CLI.hpp>

namespace hyspec::cli {

void register_info(CLI::App& app, int& exit_code);
void register_tokenize(CLI::App& app, int& exit_code);
void register_run(CLI::App& app, int& exit_code);
void register_logits(CLI::App& app, int& exit_code);
void register_bench(CLI::App& app, int& exit_code);
void register_serve(CLI::App& app, int& exit_code);
void register_convert(CLI::App& app, int& exit_code);

}  // namespace hyspec::cli
