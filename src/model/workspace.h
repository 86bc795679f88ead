// The activation workspace of a model's forward pass (internal to src/model): x, h and mix rows of
// the model width, four scratch rows of `wide` columns and an optional `small` row, each
// [max_tokens, width], carved from one backend allocation that only grows.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace hyspec {

struct StepWorkspace {
  int64_t max_tokens = 0;
  int64_t wide = 0;  // width of t1..t4: the widest intermediate, rounded up to 16
  Buffer storage;
  float *x = nullptr, *h = nullptr, *mix = nullptr, *t1 = nullptr, *t2 = nullptr, *t3 = nullptr, *t4 = nullptr,
        *small = nullptr;

  // Room for steps of max_tokens tokens (no-op when there is already); the pointers change when it
  // grows. small_width 0: no small row.
  Status reserve(Backend& backend, int64_t max_tokens, int64_t n_embd, int64_t widest, int64_t small_width = 0);
};

}  // namespace hyspec
