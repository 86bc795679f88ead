#include "engine/spec/dflash_drafter.h"

#include <algorithm>
#include <filesystem>

#include "engine/step_graphs.h"
#include "model/dflash.h"

namespace hyspec {
namespace {

struct DflashWeights {
  std::unique_ptr<GgufFile> file;  // the GGUF the weights view (null for an HF directory)
  std::unique_ptr<DflashModel> model;
};

class DflashDrafter final : public Drafter {
 public:
  DflashDrafter(DflashWeights& w, std::shared_ptr<void> keep, int max_rows, bool use_graphs)
      : w_(w), keep_(std::move(keep)), m_(*w.model), be_(m_.backend()), max_rows_(max_rows), steps_(be_, use_graphs) {}

  Status init(int64_t n_ctx) {
    const auto& hp = m_.hparams();
    HS_ASSIGN_OR_RETURN(state_, m_.create_state(n_ctx + hp.block_size, GgmlType::F32));
    const int rows = std::max(max_rows_, hp.block_size);
    HS_ASSIGN_OR_RETURN(ints_, be_.alloc(static_cast<size_t>(3 * rows) * sizeof(int32_t)));
    HS_ASSIGN_OR_RETURN(logits_, be_.alloc(static_cast<size_t>(hp.block_size * m_.n_vocab_draft()) * sizeof(float)));
    return Status::ok();
  }

  std::string name() const override { return "dflash"; }
  DrafterNeeds needs() const override { return {false, m_.hparams().target_layers}; }
  int max_draft() const override { return m_.hparams().block_size - 1; }
  GraphStats graph_stats() const override { return steps_.stats(); }

  Status reset(SequenceState&) override {
    context_ = 0;
    return Status::ok();
  }

  Status observe(const CommittedRows& rows) override {
    for (int64_t s = 0; s < rows.n; s += max_rows_) {
      const int64_t n = std::min<int64_t>(max_rows_, rows.n - s);
      std::vector<int32_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(rows.first_pos + s + i);
      be_.upload(positions(), pos.data(), n * sizeof(int32_t));
      DflashInjectArgs a;
      a.n = n;
      a.features = rows.features.rows(s, n);
      a.positions = positions();
      // A verify round's rows are recorded (at most block_size of them); a prompt's chunks, of any
      // length, run as they come.
      if (n > m_.hparams().block_size) {
        HS_RETURN_IF_ERROR(m_.inject(a, state_));
      } else {
        const StepGraphs::Key key = {kInject, n, reinterpret_cast<int64_t>(a.features.data)};
        HS_RETURN_IF_ERROR(steps_.run(key, [this, a] { return m_.inject(a, state_); }));
      }
    }
    context_ = rows.first_pos + rows.n;
    pending_ = rows.next_tokens.back();
    return Status::ok();
  }

  Result<std::vector<int32_t>> propose(int max_k) override {
    HS_ASSIGN_OR_RETURN(const OnDevice d, run_block(max_k));
    std::vector<int32_t> ids(static_cast<size_t>(d.count)), drafts;
    if (d.count > 0) be_.download(ids.data(), d.ids, ids.size() * sizeof(int32_t));
    for (int32_t id : ids) drafts.push_back(m_.target_token(id));
    return drafts;
  }
  // A drafter with its own vocabulary (d2t) maps its ids to the target's on the host.
  bool drafts_on_device() const override { return !m_.has_d2t(); }
  Result<OnDevice> propose_on_device(int max_k) override {
    if (m_.has_d2t()) return Status::error("a DFlash drafter with a d2t map proposes on the host");
    return run_block(max_k);
  }

 private:
  // The drafter's block, its argmaxes (drafter ids) left in out_ids().
  Result<OnDevice> run_block(int max_k) {
    const auto& hp = m_.hparams();
    const int64_t B = std::min<int64_t>(hp.block_size, state_.n_ctx - context_);
    const int k = static_cast<int>(std::min<int64_t>(max_k, B - 1));
    if (k <= 0) return OnDevice{};
    // The block: the pending token then masks, at the positions right after the context.
    std::vector<int32_t> block(B, hp.mask_token_id), pos(B);
    block[0] = pending_;
    for (int64_t i = 0; i < B; ++i) pos[i] = static_cast<int32_t>(context_ + i);
    be_.upload(tokens(), block.data(), B * sizeof(int32_t));
    be_.upload(positions(), pos.data(), B * sizeof(int32_t));
    DflashDraftArgs a;
    a.n = B;
    a.tokens = tokens();
    a.positions = positions();
    a.logits = Rows(logits_.as<float>(), B - 1, m_.n_vocab_draft());  // block rows 1..B-1 are the drafts
    a.max_keys = recorded_key_bound(context_ + B, state_.n_ctx);
    HS_RETURN_IF_ERROR(steps_.run({kDraft, B, a.max_keys}, [this, a] {
      HS_RETURN_IF_ERROR(m_.draft(a, state_));
      be_.argmax(a.logits, out_ids());
      return Status::ok();
    }));
    return OnDevice{out_ids(), k};
  }

  int32_t* tokens() const { return ints_.as<int32_t>(); }
  int32_t* positions() const { return ints_.as<int32_t>() + std::max(max_rows_, m_.hparams().block_size); }
  int32_t* out_ids() const { return ints_.as<int32_t>() + 2 * std::max(max_rows_, m_.hparams().block_size); }

  DflashWeights& w_;
  std::shared_ptr<void> keep_;
  DflashModel& m_;
  Backend& be_;
  int max_rows_;
  DflashState state_;
  Buffer ints_, logits_;
  // The block's draft (by block length) and the context injections (by rows and feature buffer).
  static constexpr int64_t kDraft = 0, kInject = 1;
  StepGraphs steps_;
  int64_t context_ = 0;
  int32_t pending_ = 0;
};

}  // namespace

Result<std::shared_ptr<void>> load_dflash_weights(Qwen35Model& target, const std::string& path, int max_rows,
                                                  int64_t draft_vocab) {
  auto w = std::make_shared<DflashWeights>();
  DflashTarget t = DflashTarget::of(target);
  const bool reduced = draft_vocab > 0 && draft_vocab < t.output.n_out;
  if (reduced) t.output.n_out = draft_vocab;  // the head's first rows
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    HS_ASSIGN_OR_RETURN(w->model, DflashModel::load_hf(target.backend(), path, t));
  } else {
    HS_ASSIGN_OR_RETURN(w->file, GgufFile::open(path));
    HS_ASSIGN_OR_RETURN(w->model, DflashModel::load(target.backend(), *w->file, t));
  }
  if (reduced && w->model->n_vocab_draft() != draft_vocab)
    return Status::errorf("{}: --draft-vocab: this drafter has its own head of {} rows", path,
                          w->model->n_vocab_draft());
  if (w->model->hparams().n_embd_target != target.hparams().n_embd)
    return Status::errorf("{}: drafter expects target hidden size {}, the target has {}", path,
                          w->model->hparams().n_embd_target, target.hparams().n_embd);
  HS_RETURN_IF_ERROR(w->model->reserve(std::max(max_rows, w->model->hparams().block_size)));
  return std::static_pointer_cast<void>(w);
}

Result<std::unique_ptr<Drafter>> make_dflash_drafter(Qwen35Model&, const std::shared_ptr<void>& weights,
                                                     int max_rows, int64_t n_ctx, bool use_graphs) {
  if (!weights) return Status::error("no DFlash drafter loaded");
  auto& w = *static_cast<DflashWeights*>(weights.get());
  auto d = std::make_unique<DflashDrafter>(w, weights, max_rows, use_graphs);
  HS_RETURN_IF_ERROR(d->init(n_ctx));
  return std::unique_ptr<Drafter>(std::move(d));
}

}  // namespace hyspec
