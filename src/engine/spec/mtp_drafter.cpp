#include "engine/spec/mtp_drafter.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/step_graphs.h"

namespace hyspec {
namespace {

// Each draft token stays on the device: a step reads the previous step's argmax as its token, so a
// proposal of k tokens runs its steps back to back and reads the k ids back once (a step used to upload
// its token and read its argmax, a round trip per token). With graphs, each chained step (one row) is
// recorded once per step index and replayed, and so is the observe of a round's kept rows (by count).
// observe runs the MTP block over the kept rows (its KV cache needs every position) but not the head:
// the first draft's logits (the head, 834 MB on a 9B) wait for propose, so a plain round, which drafts
// nothing next (the adaptive back-off), does not pay for them.
class MtpDrafter final : public Drafter {
 public:
  static constexpr int kMaxSteps = 64;  // Drafter::max_draft()
  static constexpr int64_t kObserve = -1;  // steps_ key of an observe (chained steps are 0 ..)

  MtpDrafter(Qwen35Model& m, int max_rows, bool use_graphs, int64_t draft_vocab)
      : model_(m),
        be_(m.backend()),
        max_rows_(max_rows),
        steps_(be_, use_graphs),
        V_(draft_vocab > 0 && draft_vocab < m.hparams().n_vocab ? draft_vocab : m.hparams().n_vocab) {}

  Status init() {
    const int64_t E = model_.hparams().n_embd, V = V_;
    HS_ASSIGN_OR_RETURN(ints_, be_.alloc(static_cast<size_t>(2 * max_rows_ + 2 * kMaxSteps + 8) * sizeof(int32_t)));
    HS_ASSIGN_OR_RETURN(hidden_, be_.alloc(static_cast<size_t>((max_rows_ + 2) * E) * sizeof(float)));
    HS_ASSIGN_OR_RETURN(logits_, be_.alloc(static_cast<size_t>(V) * sizeof(float)));
    return Status::ok();
  }

  std::string name() const override { return "mtp"; }
  DrafterNeeds needs() const override { return {true, {}}; }
  int max_draft() const override { return kMaxSteps; }
  GraphStats graph_stats() const override { return steps_.stats(); }
  Status reset(SequenceState& state) override {
    if (state_ != &state) steps_.clear();  // recorded against the old state's KV
    state_ = &state;
    have_first_ = false;
    return Status::ok();
  }

  Status observe(const CommittedRows& rows) override {
    const int64_t E = model_.hparams().n_embd;
    if (rows.n <= 0) return Status::ok();
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
      a.out_hidden = Rows(hidden_.as<float>(), n, E);
      a.max_keys = recorded_key_bound(pos[n - 1] + 1, state_->n_ctx);
      auto block = [this, a] { return model_.forward_mtp(a, *state_); };
      // A decoding round's rows (at most a verify window: kMaxSteps + 1, from the target's or the session's
      // row buffers, at fixed addresses) replay a graph per count; a prompt's chunks run as they come, so
      // prompts of many lengths do not each record one.
      if (rows.n <= std::min<int64_t>(max_rows_, kMaxSteps + 1)) {
        HS_RETURN_IF_ERROR(steps_.run({kObserve, n, reinterpret_cast<int64_t>(a.hidden.data), a.max_keys}, block));
      } else {
        HS_RETURN_IF_ERROR(block());
      }
      last_pos_ = pos[n - 1];
    }
    // The last row's normed hidden seeds the chain: the head reads it in propose (the first draft).
    be_.copy(chain(0), hidden_.as<float>() + ((rows.n - 1) % max_rows_) * E, E * sizeof(float));
    have_first_ = true;
    return Status::ok();
  }

  Result<std::vector<int32_t>> propose(int max_k) override {
    HS_ASSIGN_OR_RETURN(const OnDevice d, propose_on_device(max_k));
    std::vector<int32_t> drafts(static_cast<size_t>(d.count));
    if (d.count > 0) be_.download(drafts.data(), d.ids, drafts.size() * sizeof(int32_t));
    return drafts;
  }
  bool drafts_on_device() const override { return true; }
  Result<OnDevice> propose_on_device(int max_k) override {
    if (!have_first_ || max_k <= 0) return OnDevice{};
    const int k = std::min(max_k, kMaxSteps);
    if (k > 1) {
      std::vector<int32_t> pos(static_cast<size_t>(k - 1));
      for (int i = 1; i < k; ++i) pos[i - 1] = static_cast<int32_t>(last_pos_ + i);
      be_.upload(step_positions(), pos.data(), pos.size() * sizeof(int32_t));
    }
    step_key_bound_ = recorded_key_bound(last_pos_ + k, state_->n_ctx);  // the last chained step's keys
    for (int i = 0; i < k; ++i) HS_RETURN_IF_ERROR(run_step(i));
    return OnDevice{ids(), k};
  }

 private:
  // Step 0: the head over chain(0) (the last observed row), argmax into ids()[0]. Chained step i (1 ..):
  // token ids()[i-1] at step_positions()[i-1], hidden chain((i-1) % 2) -> chain(i % 2), argmax into ids()[i].
  Status step(int i) {
    const int64_t E = model_.hparams().n_embd, V = V_;
    if (i == 0) {
      HS_RETURN_IF_ERROR(model_.mtp_logits(Rows(chain(0), 1, E), Rows(logits_.as<float>(), 1, V)));
      be_.argmax(Rows(logits_.as<float>(), 1, V), ids());
      return Status::ok();
    }
    MtpArgs a;
    a.n = 1;
    a.hidden = Rows(chain((i - 1) % 2), 1, E);
    a.tokens = ids() + (i - 1);
    a.positions = step_positions() + (i - 1);
    a.logits = Rows(logits_.as<float>(), 1, V);
    a.out_hidden = Rows(chain(i % 2), 1, E);
    a.max_keys = step_key_bound_;
    HS_RETURN_IF_ERROR(model_.forward_mtp(a, *state_));
    be_.argmax(a.logits, ids() + i);
    return Status::ok();
  }
  // Step 0 has no attention: one graph for every bound.
  Status run_step(int i) { return steps_.run({i, i > 0 ? step_key_bound_ : 0}, [this, i] { return step(i); }); }

  int32_t* tok() const { return ints_.as<int32_t>(); }
  int32_t* positions() const { return ints_.as<int32_t>() + max_rows_; }
  int32_t* ids() const { return ints_.as<int32_t>() + 2 * max_rows_; }  // [kMaxSteps]: the drafts
  int32_t* step_positions() const { return ids() + kMaxSteps; }          // [kMaxSteps - 1]
  // Two ping-pong rows after the observe rows hold the chained hidden state.
  float* chain(int i) const { return hidden_.as<float>() + (max_rows_ + i) * model_.hparams().n_embd; }

  Qwen35Model& model_;
  Backend& be_;
  int max_rows_;
  StepGraphs steps_;  // the chained steps, by step index
  int64_t V_;  // logits per draft: the head's first V_ rows
  SequenceState* state_ = nullptr;
  Buffer ints_, hidden_, logits_;
  int64_t last_pos_ = 0;
  int64_t step_key_bound_ = 0;  // the chained steps' AttentionArgs::max_keys (recorded_key_bound), per propose
  bool have_first_ = false;
};

}  // namespace

Result<std::unique_ptr<Drafter>> make_mtp_drafter(Qwen35Model& model, int max_rows, bool use_graphs,
                                                  int64_t draft_vocab) {
  if (!model.has_mtp()) return Status::error("--spec mtp: this model has no MTP (nextn) head");
  auto d = std::make_unique<MtpDrafter>(model, max_rows, use_graphs, draft_vocab);
  HS_RETURN_IF_ERROR(d->init());
  return std::unique_ptr<Drafter>(std::move(d));
}

}  // namespace hyspec
