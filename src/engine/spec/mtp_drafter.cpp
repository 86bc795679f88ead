#include "engine/spec/mtp_drafter.h"

#include <algorithm>

namespace hyspec {
namespace {

class MtpDrafter final : public Drafter {
 public:
  MtpDrafter(Qwen35Model& m, int max_rows) : model_(m), be_(m.backend()), max_rows_(max_rows) {}

  Status init() {
    const int64_t E = model_.hparams().n_embd, V = model_.hparams().n_vocab;
    HS_ASSIGN_OR_RETURN(ints_, be_.alloc(static_cast<size_t>(3 * max_rows_ + 8) * sizeof(int32_t)));
    HS_ASSIGN_OR_RETURN(hidden_, be_.alloc(static_cast<size_t>((max_rows_ + 2) * E) * sizeof(float)));
    HS_ASSIGN_OR_RETURN(logits_, be_.alloc(static_cast<size_t>(V) * sizeof(float)));
    return Status::ok();
  }

  std::string name() const override { return "mtp"; }
  DrafterNeeds needs() const override { return {true, {}}; }
  Status reset(SequenceState& state) override {
    state_ = &state;
    have_first_ = false;
    return Status::ok();
  }

  Status observe(const CommittedRows& rows) override {
    const int64_t E = model_.hparams().n_embd, V = model_.hparams().n_vocab;
    for (int64_t s = 0; s < rows.n; s += max_rows_) {
      const int64_t n = std::min<int64_t>(max_rows_, rows.n - s);
      std::vector<int32_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(rows.first_pos + s + i);
      be_.upload(tok(), rows.next_tokens.data() + s, n * sizeof(int32_t));
      be_.upload(positions(), pos.data(), n * sizeof(int32_t));
      MtpArgs a;
      a.n = n;
      a.hidden = rows.hidden.rows(s, n);
      a.tokens = tok();
      a.positions = positions();
      a.logits = Rows(logits_.as<float>(), 1, V);
      a.out_hidden = Rows(hidden_.as<float>(), n, E);
      HS_RETURN_IF_ERROR(model_.forward_mtp(a, *state_));
      last_pos_ = pos[n - 1];
      if (s + n == rows.n) {
        // The last row's head output is the first draft; its hidden seeds the chain.
        be_.copy(chain(0), hidden_.as<float>() + (n - 1) * E, E * sizeof(float));
        be_.argmax(a.logits, out_id());
        be_.download(&first_draft_, out_id(), sizeof(int32_t));
        have_first_ = true;
      }
    }
    return Status::ok();
  }

  Result<std::vector<int32_t>> propose(int max_k) override {
    std::vector<int32_t> drafts;
    if (!have_first_ || max_k <= 0) return drafts;
    const int64_t E = model_.hparams().n_embd, V = model_.hparams().n_vocab;
    drafts.push_back(first_draft_);
    for (int i = 1; i < max_k; ++i) {
      const int32_t pos = static_cast<int32_t>(last_pos_ + i);
      be_.upload(tok(), &drafts.back(), sizeof(int32_t));
      be_.upload(positions(), &pos, sizeof(int32_t));
      MtpArgs a;
      a.n = 1;
      a.hidden = Rows(chain((i - 1) % 2), 1, E);
      a.tokens = tok();
      a.positions = positions();
      a.logits = Rows(logits_.as<float>(), 1, V);
      a.out_hidden = Rows(chain(i % 2), 1, E);
      HS_RETURN_IF_ERROR(model_.forward_mtp(a, *state_));
      be_.argmax(a.logits, out_id());
      int32_t next = 0;
      be_.download(&next, out_id(), sizeof(int32_t));
      drafts.push_back(next);
    }
    return drafts;
  }

 private:
  int32_t* tok() const { return ints_.as<int32_t>(); }
  int32_t* positions() const { return ints_.as<int32_t>() + max_rows_; }
  int32_t* out_id() const { return ints_.as<int32_t>() + 2 * max_rows_; }
  // Two ping-pong rows after the observe rows hold the chained hidden state.
  float* chain(int i) const { return hidden_.as<float>() + (max_rows_ + i) * model_.hparams().n_embd; }

  Qwen35Model& model_;
  Backend& be_;
  int max_rows_;
  SequenceState* state_ = nullptr;
  Buffer ints_, hidden_, logits_;
  int32_t first_draft_ = 0;
  int64_t last_pos_ = 0;
  bool have_first_ = false;
};

}  // namespace

Result<std::unique_ptr<Drafter>> make_mtp_drafter(Qwen35Model& model, int max_rows) {
  if (!model.has_mtp()) return Status::error("--spec mtp: this model has no MTP (nextn) head");
  auto d = std::make_unique<MtpDrafter>(model, max_rows);
  HS_RETURN_IF_ERROR(d->init());
  return std::unique_ptr<Drafter>(std::move(d));
}

}  // namespace hyspec
