// The engine flags shared by run, bench, logits and serve (llama.cpp spelling where one exists).
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine.h"

namespace hyspec::cli {

struct EngineFlags {
  std::string model;
  std::string backend = "cpu";
  int threads = 0;
  int64_t ctx = 0;
  int batch = 0;  // 0: the backend's default (EngineConfig::n_batch)
  std::string kv_type;  // empty: f16 on CUDA (llama.cpp's default; the tensor-core attention), f32 on the CPU
  std::string capture_type = "updates";
  std::string spec = "none";
  std::string draft_model;
  int draft_max = 15;  // EngineConfig::draft_max
  int64_t draft_vocab = 0;  // EngineConfig::draft_vocab
  bool dequantize = false;
  bool no_graphs = false;
  std::string pad_verify = "auto";  // EngineConfig::pad_verify
  std::string look_ahead = "auto";  // EngineConfig::look_ahead
  bool f16_matvec = false;

  void add_to(CLI::App& cmd, bool with_spec = true);
  Result<EngineConfig> to_config() const;
};

// Prints "error: <message>" on one line and returns 1.
int fail(const Status& s);

}  // namespace hyspec::cli
