#include "model/workspace.h"

namespace hyspec {

Status StepWorkspace::reserve(Backend& backend, int64_t tokens, int64_t n_embd, int64_t widest, int64_t small_width) {
  if (tokens <= max_tokens) return Status::ok();
  const int64_t w = (widest + 15) / 16 * 16;
  const int64_t per_token = 3 * n_embd + 4 * w + small_width;
  HS_ASSIGN_OR_RETURN(storage, backend.alloc(static_cast<size_t>(tokens * per_token) * sizeof(float)));
  float* p = storage.as<float>();
  auto take = [&](int64_t width) {
    float* r = p;
    p += tokens * width;
    return r;
  };
  x = take(n_embd);
  h = take(n_embd);
  mix = take(n_embd);
  t1 = take(w);
  t2 = take(w);
  t3 = take(w);
  t4 = take(w);
  small = small_width > 0 ? take(small_width) : nullptr;
  wide = w;
  max_tokens = tokens;
  return Status::ok();
}

}  // namespace hyspec
