// Hugging Face checkpoint -> GGUF, the way llama.cpp's convert_hf_to_gguf.py writes it, for the
// architectures hyspec runs (the metadata keys with their order and types, tensor names, shapes and
// values are checked against that converter's output in tests/cli/convert_test.cpp):
//
//  Qwen3_5ForCausalLM -> `qwen35` (QWEN35.md "Conventions already applied by the converter"):
//   - RMSNorm weights + 1 (HF stores w - 1), except the GDN output norm (ssm_norm);
//   - A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C, 1, K] -> ssm_conv1d [K, C];
//   - the v-heads, stored grouped by k-head in HF (v-head h uses k-head h / (Hv/Hk)), are reordered
//     to tiled order (v-head h uses k-head h mod Hk) in attn_qkv (v rows), attn_gate, ssm_beta,
//     ssm_alpha, ssm_a, ssm_dt.bias, ssm_conv1d (v channels) and ssm_out (columns);
//   - attn_q keeps HF's per-head [query | gate] rows; the MTP block (mtp.*) becomes the trailing block
//     blk.<n_layer>: mtp.fc -> nextn.eh_proj, pre_fc_norm_embedding/hidden -> nextn.enorm/hnorm,
//     mtp.norm -> nextn.shared_head_norm, mtp.layers.0.* -> the block's attention and FFN tensors.
//  DFlashDraftModel (z-lab) -> `dflash`: tensors renamed only (hidden_norm -> enc.output_norm,
//   layers.N -> blk.N, norm -> output_norm); dflash.target_layers = target_layer_ids + 1; the
//   vocabulary comes from the target's directory and the mask token from dflash_config.
//
// Matrices take the requested type; 1-D tensors, norms, ssm_a, ssm_dt.bias and ssm_conv1d stay F32,
// and a Q8_0 matrix whose rows are not a multiple of 32 falls back to F16, as in llama.cpp.
// The tokenizer (tokenizer.ggml.*) is the text layer's part: text/hf_vocab.h.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf_writer.h"
#include "util/status.h"

namespace hyspec {

struct HfConvertOptions {
  GgmlType type = GgmlType::F32;  // F32, F16, BF16 or Q8_0
  std::string name;               // general.name; default: the directory's name, first letter capitalised
};

struct HfConversion {
  std::string arch;               // "qwen35" or "dflash"
  GgufWriter writer;              // general.*, <arch>.*, general.quantization_version, every tensor
  int64_t n_vocab = 0;            // tokenizer.ggml.tokens must have this many entries (config vocab_size)
  bool vocab_from_target = false; // DFlash: the drafter ships no tokenizer; take the target's
  // Keys the converter writes after the tokenizer's (DFlash: tokenizer.ggml.mask_token_id).
  std::vector<std::pair<std::string, GgufMetaValue>> after_vocab;
  int64_t n_params = 0;
};

// Reads config.json and the safetensors weights (model.safetensors, or the shards named by
// model.safetensors.index.json) of `dir`. Errors name the file and the tensor or key.
Result<HfConversion> convert_hf_model(const std::string& dir, const HfConvertOptions& options);

// "f32" | "f16" | "bf16" | "q8_0" -> the GGML type; llama.cpp's general.file_type of that choice.
Result<GgmlType> parse_convert_type(const std::string& name);
uint32_t gguf_file_type(GgmlType type);

// llama.cpp's general.size_label for a parameter count ("345K", "2.1M", "9.0B").
std::string gguf_size_label(int64_t n_params);

}  // namespace hyspec
