#include "cli/engine_options.h"

#include "cli/default_model.h"
#include "model/hf_convert.h"

#include <cstdio>

namespace hyspec::cli {

void EngineFlags::add_to(CLI::App& cmd, bool with_spec) {
  cmd.add_option("-m,--model", model, "Model GGUF");
  cmd.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd.add_option("-t,--threads", threads, "CPU threads (0: all cores)");
  cmd.add_option("-c,--ctx-size", ctx, "Context length (0: the model's, at most 8192)");
  cmd.add_option("-b,--batch-size", batch, "Prompt tokens per forward pass (0: 512 on CUDA, 256 on the CPU)");
  cmd.add_option("--kv-type", kv_type,
                 "KV cache type: f32, f16, bf16 or q8_0 (8.5 bits per value, as llama.cpp's -ctk/-ctv q8_0); "
                 "default f16 on CUDA, f32 on the CPU")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd.add_option("--capture-type", capture_type,
                 "What a verify step keeps of each token's GDN state for the rollback: updates (the default; lossless, "
                 "~1/128 of a state's bytes, replayed on rollback), f32 states (lossless) or f16 states (half of "
                 "f32's bytes; rollbacks round)")
      ->check(CLI::IsMember({"f32", "f16", "updates"}));
  cmd.add_flag("--dequantize", dequantize, "Convert every weight to F32 at load (kernel parity checks)");
  cmd.add_flag("--no-graphs", no_graphs, "CUDA: do not record/replay steps as CUDA graphs");
  cmd.add_flag("--f16-matvec", f16_matvec,
               "CUDA: Q4_K/Q5_K/Q6_K decode/verify matmuls on f16 activations (slower; ~3e-4 instead of ~5e-3 error per product)");
  cmd.add_option("--look-ahead", look_ahead,
                 "Plain rounds (greedy, or sampled under temperature alone or top-k <= 256) keep the next step "
                 "enqueued while the host reads the last one back: auto (on CUDA), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  if (with_spec) {
    cmd.add_option("--spec", spec, "Speculative decoding: none, ngram, mtp, dflash, mtp+ngram, dflash+ngram")
        ->check(CLI::IsMember({"none", "ngram", "mtp", "dflash", "mtp+ngram", "dflash+ngram"}));
    cmd.add_option("--draft-model", draft_model, "DFlash drafter: GGUF file or HF directory");
    cmd.add_option("--draft-max", draft_max, "Most drafted tokens per round (0..64)");
    cmd.add_option("--pad-verify", pad_verify,
                   "Pad verify steps of 3+ rows to whole 8-row tiles with rows that change nothing: auto (where steps "
                   "are recorded as CUDA graphs: one graph per tile count instead of per width), on, off")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    cmd.add_option("--draft-vocab", draft_vocab,
                   "MTP/DFlash drafts from the first N token ids only (a cheaper draft head; 0: all)")
        ->check(CLI::NonNegativeNumber);
  }
}

Result<EngineConfig> EngineFlags::to_config() const {
  EngineConfig c;
  // No -m: the embedded demo model family (models/README.md), with its DFlash drafter.
  c.model_path = model.empty() ? default_model_path() : model;
  if (c.model_path.empty()) return Status::error("no model given (-m MODEL.gguf) and no default model found");
  HS_ASSIGN_OR_RETURN(c.backend, parse_backend_kind(backend));
  c.n_threads = threads;
  c.n_ctx = ctx;
  c.n_batch = batch;
  // An F32 cache on CUDA takes the SIMT attention kernels and twice F16's bytes (H200 kernel bench, a
  // 512-token prompt after 16K cached: 11.5 ms a layer on the SIMT kernel, 1.5 on the tensor cores), so
  // CUDA defaults to F16, as llama.cpp does.
  const std::string kv = kv_type.empty() ? (c.backend == BackendKind::Cuda ? "f16" : "f32") : kv_type;
  HS_ASSIGN_OR_RETURN(c.kv_type, parse_convert_type(kv));  // the four names `convert --type` takes
  HS_ASSIGN_OR_RETURN(c.capture, parse_state_capture(capture_type));
  const std::string suffix = "+ngram";
  c.add_ngram = spec.size() > suffix.size() && spec.ends_with(suffix);
  HS_ASSIGN_OR_RETURN(c.spec, parse_spec_method(c.add_ngram ? spec.substr(0, spec.size() - suffix.size()) : spec));
  c.draft_model = draft_model;
  if (c.draft_model.empty() && model.empty() && c.spec == SpecMethod::Dflash) c.draft_model = default_draft_model_path();
  c.draft_max = draft_max;
  c.draft_vocab = draft_vocab;
  c.dequantize = dequantize;
  c.use_graphs = !no_graphs;
  HS_ASSIGN_OR_RETURN(c.pad_verify, parse_pad_verify(pad_verify));
  HS_ASSIGN_OR_RETURN(c.look_ahead, parse_look_ahead(look_ahead));
  c.int8_matvec = !f16_matvec;
  return c;
}

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace hyspec::cli
