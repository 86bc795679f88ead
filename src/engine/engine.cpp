#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "engine/logit_rows.h"
#include "engine/spec/dflash_drafter.h"
#include "engine/spec/mtp_drafter.h"
#include "engine/spec/ngram_drafter.h"

namespace hyspec {

namespace {
constexpr int kProbeRounds = 2;          // speculative rounds that decide a probe
// The first plain stretch after speculation lost: short, so that an unlucky probe does not hold a short
// run plain for long (H100, demo models, 48 prompts: MTP-3 / MTP-15 / DFlash / n-gram 1.31 / 1.13 / 0.91 / 2.47x
// of plain at 16 rounds -> 1.40 / 1.14 / 0.93 / 2.55x at 4; a 9B MTP head that never pays probes more: -1%).
constexpr int kMinBackoffRounds = 4;
constexpr int kMaxBackoffRounds = 1024;
constexpr double kSpecWinMargin = 0.97;  // speculation must emit at least this share of plain's rate
constexpr int64_t kDeferredRows = 32;     // rows a plain stretch's drafter observe takes at once (Session::observe)
constexpr int64_t kDeferredRing = 2 * kDeferredRows;  // the rows waiting for it, by position
// The deferred buffers: the ring, then the kDeferredRows rows an observe reads (at a fixed address, so that
// a drafter's recorded observe steps stay one per row count).
constexpr int64_t kDeferredBufferRows = kDeferredRing + kDeferredRows;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "unknown";
}

Result<SpecMethod> parse_spec_method(const std::string& name) {
  if (name == "none") return SpecMethod::None;
  if (name == "ngram") return SpecMethod::Ngram;
  if (name == "mtp") return SpecMethod::Mtp;
  if (name == "dflash") return SpecMethod::Dflash;
  return Status::errorf("unknown speculative method '{}' (none, ngram, mtp, dflash)", name);
}

Result<PadVerify> parse_pad_verify(const std::string& name) {
  if (name == "auto") return PadVerify::kAuto;
  if (name == "on") return PadVerify::kOn;
  if (name == "off") return PadVerify::kOff;
  return Status::errorf("--pad-verify '{}' is not supported (auto, on or off)", name);
}

Result<LookAhead> parse_look_ahead(const std::string& name) {
  if (name == "auto") return LookAhead::kAuto;
  if (name == "on") return LookAhead::kOn;
  if (name == "off") return LookAhead::kOff;
  return Status::errorf("--look-ahead '{}' is not supported (auto, on or off)", name);
}

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::None: return "none";
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::Mtp: return "mtp";
    case SpecMethod::Dflash: return "dflash";
  }
  return "unknown";
}

Engine::~Engine() = default;
Session::Session(Engine& engine) : engine_(engine), graphs_(*engine.backend_, engine.config_.use_graphs) {}
Session::~Session() { (void)finish_ahead(); }

Status Session::finish_ahead() {
  if (!ahead_.in_flight) return Status::ok();
  ahead_.in_flight = false;
  int32_t unused = 0;
  return ahead_.token[ahead_.slot]->finish(&unused, sizeof(int32_t));
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  if (config.n_batch == 0) e->config_.n_batch = config.backend == BackendKind::Cuda ? 512 : 256;
  HS_ASSIGN_OR_RETURN(e->file_, GgufFile::open(config.model_path));
  BackendOptions bo;
  bo.n_threads = config.n_threads;
  bo.int8_matvec = config.int8_matvec;
  HS_ASSIGN_OR_RETURN(e->backend_, create_backend(config.backend, bo));
  LoadOptions lo;
  lo.dequantize_to_f32 = config.dequantize;
  lo.load_mtp = config.spec == SpecMethod::Mtp;
  HS_ASSIGN_OR_RETURN(e->model_, Qwen35Model::load(*e->backend_, *e->file_, lo));
  const Qwen35Hparams& hp = e->model_->hparams();
  e->n_ctx_ = config.n_ctx > 0 ? config.n_ctx : std::min<int64_t>(hp.n_ctx_train, 8192);
  if (config.draft_max < 0 || config.draft_max > 64)
    return Status::errorf("--draft-max {} is out of range (0..64)", config.draft_max);
  if (config.n_batch < 0) return Status::errorf("batch size {} is invalid", config.n_batch);
  if (config.draft_vocab < 0) return Status::errorf("--draft-vocab {} is invalid", config.draft_vocab);
  // Rounded up to whole 256-row tiles (the matvec kernels' fast path); the whole vocabulary is 0.
  e->config_.draft_vocab = (config.draft_vocab + 255) / 256 * 256;
  if (e->config_.draft_vocab >= hp.n_vocab) e->config_.draft_vocab = 0;
  e->max_verify_ = config.spec == SpecMethod::None ? 1 : config.draft_max + 1;
  if (config.spec == SpecMethod::Dflash) {
    if (config.draft_model.empty()) return Status::error("--spec dflash needs --draft-model (GGUF or HF directory)");
    HS_ASSIGN_OR_RETURN(e->dflash_, load_dflash_weights(*e->model_, config.draft_model, e->config_.n_batch,
                                                              e->config_.draft_vocab));
  }
  // What the drafter needs from every committed row decides the per-step outputs.
  {
    HS_ASSIGN_OR_RETURN(auto probe, e->make_drafter());
    if (probe) e->needs_ = probe->needs();
  }
  const int64_t rows = std::max<int64_t>(e->config_.n_batch, e->max_verify_);
  HS_RETURN_IF_ERROR(e->model_->reserve(rows));
  Backend& be = *e->backend_;
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  e->feature_width_ = static_cast<int64_t>(e->needs_.taps.size()) * E;
  // Tokens, positions, then argmaxes (a greedy verify's, followed by drafts read back with them).
  HS_ASSIGN_OR_RETURN(e->ints_, be.alloc(static_cast<size_t>(3 * rows + e->max_verify_ + 8) * sizeof(int32_t)));
  HS_ASSIGN_OR_RETURN(e->logits_, be.alloc(static_cast<size_t>(e->max_verify_ * V) * sizeof(float)));
  HS_ASSIGN_OR_RETURN(e->sampling_, be.alloc(LogitRows::scratch_bytes(e->max_verify_, V)));
  if (e->needs_.final_hidden) {
    HS_ASSIGN_OR_RETURN(e->hidden_, be.alloc(static_cast<size_t>(rows * E) * sizeof(float)));
  }
  if (e->feature_width_ > 0) {
    HS_ASSIGN_OR_RETURN(e->features_, be.alloc(static_cast<size_t>(rows * e->feature_width_) * sizeof(float)));
  }
  return e;
}

double Engine::now() const { return config_.clock ? config_.clock() : now_s(); }

Result<std::unique_ptr<Drafter>> Engine::make_drafter() {
  switch (config_.spec) {
    case SpecMethod::None: return std::unique_ptr<Drafter>();
    case SpecMethod::Ngram: return make_ngram_drafter();
    case SpecMethod::Mtp:
    case SpecMethod::Dflash: {
      HS_ASSIGN_OR_RETURN(auto model, config_.spec == SpecMethod::Mtp
                                          ? make_mtp_drafter(*model_, config_.n_batch, config_.use_graphs,
                                                             config_.draft_vocab)
                                          : make_dflash_drafter(*model_, dflash_, config_.n_batch, n_ctx_,
                                                                config_.use_graphs));
      if (!config_.add_ngram) return model;
      return make_longest_of(std::move(model), make_ngram_drafter());
    }
  }
  return Status::error("unknown speculative method");
}

Result<std::unique_ptr<Session>> Engine::new_session() {
  std::unique_ptr<Session> s(new Session(*this));
  HS_ASSIGN_OR_RETURN(s->state_, model_->create_state(n_ctx_, max_verify_, config_.kv_type, config_.capture));
  HS_ASSIGN_OR_RETURN(s->drafter_, make_drafter());
  if (s->drafter_) {  // the rows of a plain stretch (Session::observe)
    const int64_t E = model_->hparams().n_embd;
    if (needs_.final_hidden) {
      HS_ASSIGN_OR_RETURN(s->deferred_.hidden, backend_->alloc(static_cast<size_t>(kDeferredBufferRows * E) * sizeof(float)));
    }
    if (feature_width_ > 0) {
      HS_ASSIGN_OR_RETURN(s->deferred_.features,
                          backend_->alloc(static_cast<size_t>(kDeferredBufferRows * feature_width_) * sizeof(float)));
    }
  }
  return s;
}

Result<std::vector<float>> Engine::prompt_logits(const std::vector<int32_t>& tokens, bool all_rows) {
  const Qwen35Hparams& hp = model_->hparams();
  const int64_t n = static_cast<int64_t>(tokens.size()), V = hp.n_vocab;
  if (n == 0) return Status::error("no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= hp.n_vocab) return Status::errorf("token id {} is outside the vocabulary (0..{})", t, hp.n_vocab - 1);
  HS_ASSIGN_OR_RETURN(SequenceState st, model_->create_state(n, 0, config_.kv_type));
  const int64_t rows_per_step = std::min<int64_t>(config_.n_batch, n);
  HS_ASSIGN_OR_RETURN(Buffer logits_buf, backend_->alloc(static_cast<size_t>((all_rows ? rows_per_step : 1) * V) * sizeof(float)));
  std::vector<float> out(static_cast<size_t>((all_rows ? n : 1) * V));
  int32_t* tok_dev = ints_.as<int32_t>();
  int32_t* pos_dev = tok_dev + model_->reserved_tokens();
  std::vector<int32_t> pos;
  for (int64_t s = 0; s < n; s += rows_per_step) {
    const int64_t m = std::min(rows_per_step, n - s);
    pos.resize(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = static_cast<int32_t>(s + i);
    backend_->upload(tok_dev, tokens.data() + s, m * sizeof(int32_t));
    backend_->upload(pos_dev, pos.data(), m * sizeof(int32_t));
    ForwardArgs a;
    a.n = m;
    a.tokens = tok_dev;
    a.positions = pos_dev;
    a.gdn_chunked = true;
    const bool last = s + m == n;
    if (all_rows) a.logits = Rows(logits_buf.as<float>(), m, V);
    else if (last) a.logits = Rows(logits_buf.as<float>(), 1, V);
    HS_RETURN_IF_ERROR(run_forward(a, st));
    if (all_rows) backend_->download(out.data() + s * V, logits_buf.data(), static_cast<size_t>(m * V) * sizeof(float));
    else if (last) backend_->download(out.data(), logits_buf.data(), static_cast<size_t>(V) * sizeof(float));
  }
  return out;
}

Result<double> Engine::time_forward(int64_t n, int64_t depth, bool capture, int reps, bool rollback) {
  const Qwen35Hparams& hp = model_->hparams();
  if (n <= 0 || reps <= 0 || (rollback && (!capture || n < 2)))
    return Status::error("time_forward: nothing to time");
  if (depth + n > n_ctx_) return Status::errorf("depth {} + {} tokens exceeds the context {} (raise -c)", depth, n, n_ctx_);
  HS_RETURN_IF_ERROR(model_->reserve(std::max<int64_t>(n, config_.n_batch)));
  // The state a session gets: the engine's context as KV capacity (attention splits follow it).
  HS_ASSIGN_OR_RETURN(SequenceState st, model_->create_state(n_ctx_, capture ? static_cast<int>(n) : 0, config_.kv_type,
                                                                     config_.capture));
  HS_ASSIGN_OR_RETURN(Buffer ints, backend_->alloc(static_cast<size_t>(2 * std::max<int64_t>(n, config_.n_batch)) * sizeof(int32_t)));
  HS_ASSIGN_OR_RETURN(Buffer logits, backend_->alloc(static_cast<size_t>(n * hp.n_vocab) * sizeof(float)));
  const int64_t cap = std::max<int64_t>(n, config_.n_batch);
  int32_t* tok_dev = ints.as<int32_t>();
  int32_t* pos_dev = tok_dev + cap;
  // Synthetic tokens at positions start..start+m-1 into the step buffers, and the step's arguments.
  std::vector<int32_t> tok, pos;
  auto stage = [&](int64_t start, int64_t m) {
    tok.resize(m);
    pos.resize(m);
    for (int64_t i = 0; i < m; ++i) {
      tok[i] = static_cast<int32_t>((start + i) * 7919 % hp.n_vocab);
      pos[i] = static_cast<int32_t>(start + i);
    }
    backend_->upload(tok_dev, tok.data(), m * sizeof(int32_t));
    backend_->upload(pos_dev, pos.data(), m * sizeof(int32_t));
  };
  auto args = [&](int64_t m, bool prefill) {
    ForwardArgs a;
    a.n = m;
    a.tokens = tok_dev;
    a.positions = pos_dev;
    a.gdn_chunked = prefill;
    a.capture = !prefill && capture;
    if (!prefill) a.max_keys = recorded_key_bound(depth + m, n_ctx_);  // the timed step's, at `depth`, as a session's
    a.logits = Rows(logits.as<float>(), prefill ? 1 : m, hp.n_vocab);
    return a;
  };
  auto forward = [&](int64_t start, int64_t m, bool prefill) {
    stage(start, m);
    return run_forward(args(m, prefill), st);
  };
  for (int64_t s = 0; s < depth; s += config_.n_batch)
    HS_RETURN_IF_ERROR(forward(s, std::min<int64_t>(config_.n_batch, depth - s), true));
  const bool prefill = n > max_verify_ && !capture;  // a prompt-sized batch runs the prompt form
  // Diagnostics (benchmarks only): HYSPEC_BENCH_PREFILL_GRAPH=1 records prompt steps as a graph too (what
  // a prompt step costs without host launches); HYSPEC_BENCH_ENQUEUE=1 prints, per timed run, how long the
  // host took to enqueue it against the whole run (a host-bound step enqueues for about all of it).
  static const bool prefill_graph = std::getenv("HYSPEC_BENCH_PREFILL_GRAPH") != nullptr;
  static const bool report_enqueue = std::getenv("HYSPEC_BENCH_ENQUEUE") != nullptr;
  // Decode/verify-sized steps run as the session runs them: recorded once, replayed (CUDA graphs).
  std::unique_ptr<StepGraph> graph;
  if (rollback) {
    HS_RETURN_IF_ERROR(forward(depth, n, false));  // captures to roll back from (each run repeats the rollback)
  } else if ((!prefill || prefill_graph) && config_.use_graphs && backend_->kind() == BackendKind::Cuda) {
    stage(depth, n);
    Status recorded;
    auto g = backend_->capture([&] { recorded = run_forward(args(n, prefill), st); });
    if (g && recorded.is_ok()) graph = std::move(g).value();
  }
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    HS_RETURN_IF_ERROR(backend_->synchronize());
    const double t0 = now_s();
    if (rollback) {
      model_->restore_captured(st, static_cast<int>(n - 2), static_cast<int>(n));
    } else if (graph) {
      HS_RETURN_IF_ERROR(graph->replay());
    } else {
      HS_RETURN_IF_ERROR(forward(depth, n, prefill));
    }
    const double enqueued = now_s();
    HS_RETURN_IF_ERROR(backend_->synchronize());
    if (r > 0) times.push_back(now_s() - t0);  // the first run warms up
    if (r > 0 && report_enqueue)
      std::fprintf(stderr, "time_forward n=%lld depth=%lld%s: enqueued in %.3f ms of %.3f ms\n",
                   static_cast<long long>(n), static_cast<long long>(depth), graph ? " (graph)" : "",
                   (enqueued - t0) * 1e3, times.back() * 1e3);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Status Engine::run_forward(const ForwardArgs& args, SequenceState& state) { return model_->forward(args, state); }

bool Engine::needs_rows() const { return needs_.final_hidden || feature_width_ > 0; }

ForwardArgs Engine::step_args(int64_t n) const {
  ForwardArgs a;
  a.n = n;
  int32_t* tok_dev = ints_.as<int32_t>();
  a.tokens = tok_dev;
  a.positions = tok_dev + model_->reserved_tokens();
  if (needs_.final_hidden) a.final_hidden = Rows(hidden_.as<float>(), n, model_->hparams().n_embd);
  if (feature_width_ > 0) {
    a.features = Rows(features_.as<float>(), n, feature_width_);
    a.taps = needs_.taps;
  }
  return a;
}

Result<SessionStats> Engine::generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                      const std::function<bool(const std::vector<int32_t>&)>& on_tokens,
                                      FinishReason* finish) {
  HS_ASSIGN_OR_RETURN(auto session, new_session());
  HS_RETURN_IF_ERROR(session->start(prompt, options));
  std::vector<int32_t> out;
  while (!session->done()) {
    out.clear();
    HS_RETURN_IF_ERROR(session->step(out));
    if (!out.empty() && on_tokens && !on_tokens(out)) session->cancel();
  }
  if (finish) *finish = session->finish_reason();
  return session->stats();
}

// ---------------------------------------------------------------------------------------------

Status Session::start(const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  const Qwen35Hparams& hp = engine_.model_->hparams();
  if (prompt.empty()) return Status::error("the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= hp.n_vocab) return Status::errorf("token id {} is outside the vocabulary (0..{})", t, hp.n_vocab - 1);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n >= engine_.n_ctx_)
    return Status::errorf("the prompt has {} tokens but the context holds {} (exceeds it by {}; raise -c)", n,
                          engine_.n_ctx_, n - engine_.n_ctx_ + 1);
  if (options.max_tokens < 0) return Status::errorf("max_tokens {} is negative", options.max_tokens);
  options_ = options;
  sampler_ = Sampler(options.sampling);
  tokens_ = prompt;
  n_prompt_ = n;
  prefilled_ = 0;
  committed_ = 0;
  finish_ = options.max_tokens == 0 ? FinishReason::Length : FinishReason::None;
  stats_ = SessionStats{};
  stats_.prompt_tokens = n;
  graphs_at_start_ = graph_stats();
  logprobs_.clear();
  draft_length_ = DraftLengthPolicy{};
  ema_spec_rate_ = plain_rate_ = 0;
  plain_rounds_left_ = options.adaptive ? kProbeRounds : 0;  // measure plain decoding first
  new_plain_stretch_ = true;
  probe_rounds_left_ = 0;
  backoff_rounds_ = kMinBackoffRounds;
  probe_tokens_ = probe_s_ = 0;
  HS_RETURN_IF_ERROR(finish_ahead());  // a step the last sequence enqueued ahead: done before its slots are reused
  engine_.model_->reset_state(state_);
  deferred_.rows.n = 0;
  if (drafter_) HS_RETURN_IF_ERROR(drafter_->reset(state_));
  return Status::ok();
}

void Session::emit(int32_t token, std::vector<int32_t>& out, const float* logits_row) {
  if (options_.logprobs >= 0 && logits_row)
    logprobs_.push_back(logprobs_of(logits_row, static_cast<int>(engine_.model_->hparams().n_vocab), token, options_.logprobs));
  out.push_back(token);
  tokens_.push_back(token);
  ++stats_.generated_tokens;
  if (options_.stop_tokens.count(token)) {
    finish_ = FinishReason::Stop;
  } else if (stats_.generated_tokens >= options_.max_tokens) {
    finish_ = FinishReason::Length;
  } else if (static_cast<int64_t>(tokens_.size()) >= engine_.n_ctx_) {
    finish_ = FinishReason::Context;
  }
}

Status Session::step(std::vector<int32_t>& out) {
  if (done()) return Status::ok();
  Status st = prefilled_ < n_prompt_ ? prefill_chunk(out) : decode_round(out);
  if (!st.is_ok()) finish_ = FinishReason::Error;
  return st;
}

Status Session::prefill_chunk(std::vector<int32_t>& out) {
  Engine& e = engine_;
  Backend& be = *e.backend_;
  const Qwen35Hparams& hp = e.model_->hparams();
  const double t0 = engine_.now();
  const int64_t start = prefilled_;
  const int64_t n = std::min<int64_t>(e.config_.n_batch, n_prompt_ - start);
  const bool last = start + n == n_prompt_;
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(start + i);
  int32_t* tok_dev = e.ints_.as<int32_t>();
  int32_t* pos_dev = tok_dev + e.model_->reserved_tokens();
  be.upload(tok_dev, tokens_.data() + start, n * sizeof(int32_t));
  be.upload(pos_dev, pos.data(), n * sizeof(int32_t));
  ForwardArgs a = e.step_args(n);
  a.gdn_chunked = true;
  const int64_t V = hp.n_vocab;
  if (last) a.logits = Rows(e.logits_.as<float>(), 1, V);
  ++e.steps_;
  HS_RETURN_IF_ERROR(e.run_forward(a, state_));
  prefilled_ += n;
  committed_ = prefilled_;
  int32_t next = -1;
  std::vector<float> logprobs_row;
  if (last) {
    LogitRows rows(be, a.logits, e.sampling_.data(), sampler_);
    rows.select(0, tokens_);
    next = rows.draw();
    // Read before the drafter's steps.
    if (options_.logprobs >= 0) logprobs_row.assign(rows.host_row(0), rows.host_row(0) + V);
  }
  if (drafter_) {
    CommittedRows rows;
    rows.first_pos = start;
    rows.n = n;
    rows.hidden = a.final_hidden;
    rows.features = a.features;
    rows.row_tokens.assign(tokens_.begin() + start, tokens_.begin() + start + n);
    rows.next_tokens.assign(tokens_.begin() + start + 1, tokens_.begin() + start + n);
    rows.next_tokens.push_back(last ? next : tokens_[start + n]);
    HS_RETURN_IF_ERROR(drafter_->observe(rows));
  }
  stats_.prefill_s += engine_.now() - t0;
  if (last) emit(next, out, logprobs_row.empty() ? nullptr : logprobs_row.data());
  return Status::ok();
}

// Deferred rows wait in a ring of kDeferredRing rows by position, up to a half (kDeferredRows) at a time: a
// look-ahead step writes its rows into the ring itself (enqueue_ahead_step), a half the next observe of the
// deferred rows does not read.
Status Session::observe(const CommittedRows& rows, bool defer) {
  CommittedRows& d = deferred_.rows;
  if (!defer || rows.n != 1) {  // (a plain round keeps one row)
    HS_RETURN_IF_ERROR(observe_deferred());
    return drafter_->observe(rows);
  }
  if (d.n > 0 && (rows.first_pos % kDeferredRows == 0 || rows.first_pos != d.first_pos + d.n))
    HS_RETURN_IF_ERROR(observe_deferred());
  if (d.n == 0) {
    d.first_pos = rows.first_pos;
    d.hidden = d.features = Rows();
    d.row_tokens.clear();
    d.next_tokens.clear();
  }
  Backend& be = *engine_.backend_;
  auto keep = [&](const Buffer& buf, Rows src, Rows& dst) -> Status {
    if (!src.data) return Status::ok();
    if (!buf.data()) return Status::error("observe: rows of an output the engine's drafter does not need");
    const Rows slot = ring_row(buf, rows.first_pos, src.n_cols);
    if (slot.data != src.data) be.copy_rows(src, slot);
    dst = Rows(buf.as<float>() + kDeferredRing * src.n_cols, d.n + 1, src.n_cols);  // where observe_deferred puts them
    return Status::ok();
  };
  HS_RETURN_IF_ERROR(keep(deferred_.hidden, rows.hidden, d.hidden));
  HS_RETURN_IF_ERROR(keep(deferred_.features, rows.features, d.features));
  d.row_tokens.insert(d.row_tokens.end(), rows.row_tokens.begin(), rows.row_tokens.end());
  d.next_tokens.insert(d.next_tokens.end(), rows.next_tokens.begin(), rows.next_tokens.end());
  d.n += 1;
  return Status::ok();
}

Rows Session::ring_row(const Buffer& ring, int64_t pos, int64_t cols) {
  return Rows(ring.as<float>() + pos % kDeferredRing * cols, 1, cols);
}

Status Session::observe_deferred() {
  CommittedRows& d = deferred_.rows;
  if (d.n == 0) return Status::ok();
  Backend& be = *engine_.backend_;
  auto gather = [&](const Buffer& ring, const Rows& out) {  // the ring's rows (within one half) to where d points
    if (out.data) be.copy_rows(Rows(ring_row(ring, d.first_pos, out.n_cols).data, d.n, out.n_cols), out);
  };
  gather(deferred_.hidden, d.hidden);
  gather(deferred_.features, d.features);
  const Status st = drafter_->observe(d);
  d.n = 0;
  deferred_.observed_this_round = true;
  // Waited for here, in the plain round that ends the stretch (plain decoding's reference rate is the
  // stretch's fastest round), not in the next round's verify step: that may be the first round of a
  // probe, which decides whether speculation comes back. Not with a step enqueued ahead (look-ahead
  // stretches time their rounds' mean; the device keeps going), nor for a drafter that observes tokens
  // alone (it enqueued nothing).
  return st.is_ok() && engine_.needs_rows() && !ahead_.in_flight ? engine_.backend_->synchronize() : st;
}

void Session::back_off() {
  plain_rounds_left_ = backoff_rounds_;
  new_plain_stretch_ = true;
  backoff_rounds_ = std::min(2 * backoff_rounds_, kMaxBackoffRounds);
}

int Session::choose_draft_length() {
  const int limit = options_.draft_max >= 0 ? options_.draft_max : engine_.config_.draft_max;
  int k = std::min(limit, drafter_ ? drafter_->max_draft() : 0);
  if (!options_.speculative || !drafter_) return 0;
  // Never draft past the context, nor past max_tokens (tokens beyond it would be thrown away), nor past the
  // key bound of the next plain step (a verify row must get its decode step's bits: decode_round).
  const int64_t room_ctx = engine_.n_ctx_ - static_cast<int64_t>(tokens_.size()) - 1;
  const int64_t room_out = options_.max_tokens - stats_.generated_tokens - 1;
  const int64_t room_bound = recorded_key_bound(committed_ + 1, engine_.n_ctx_) - committed_ - 1;
  k = static_cast<int>(std::min<int64_t>({k, room_ctx, room_out, room_bound}));
  if (k <= 0) return 0;
  if (!options_.adaptive) return k;
  // Adaptive: the length with the most expected tokens per second, one more now and then
  // (DraftLengthPolicy). Speculation that emits fewer tokens per second than plain decoding (both
  // rates measured on this sequence) is switched off for a stretch of plain rounds, then probed for
  // kProbeRounds rounds; each failed probe doubles the stretch (up to kMaxBackoffRounds), so a
  // drafter that never pays costs a vanishing share of the time, while one that pays again on a later
  // stretch of text (repetitive code, quotes of the prompt) is back within one stretch. A sequence
  // starts with kProbeRounds plain rounds (the reference rate), then a probe.
  if (plain_rounds_left_ > 0) {
    if (--plain_rounds_left_ == 0) {  // the next timed speculative rounds are a probe
      probe_rounds_left_ = kProbeRounds;
      probe_tokens_ = probe_s_ = 0;
    }
    return 0;
  }
  if (plain_rate_ == 0) return 0;  // no timed plain round yet (the first ones recorded graphs)
  if (probe_rounds_left_ == 0 && ema_spec_rate_ > 0 && ema_spec_rate_ < kSpecWinMargin * plain_rate_) {
    back_off();
    return 0;
  }
  return draft_length_.choose(engine_.round_costs_, k);
}

bool Session::looks_ahead() const {
  const LookAhead mode = engine_.config_.look_ahead;
  const bool on = mode == LookAhead::kOn || (mode == LookAhead::kAuto && engine_.backend_->asynchronous());
  // The host reads nothing of a step but its token: no logits to report, and a token the backend can pick on
  // its own (greedy's argmax, a draw under temperature alone or under a top-k cut). A drafter's plain rounds
  // too: the steps keep the rows it needs (enqueue_ahead_step).
  const SamplingParams& sp = options_.sampling;
  const int64_t n_vocab = engine_.model_->hparams().n_vocab;
  return on && !sp.has_penalties() && options_.logprobs < 0 &&
         (sp.greedy() || draws_by_chunk(sp, n_vocab) || draws_top_k(sp, n_vocab));
}

bool Session::next_round_plain() const {
  // choose_draft_length gives 0 while a plain stretch lasts; otherwise the next round may speculate.
  return !drafter_ || !options_.speculative || plain_rounds_left_ > 0;
}

Status Session::enqueue_ahead_step(int64_t pos, int slot) {
  Engine& e = engine_;
  Backend& be = *e.backend_;
  ForwardArgs a = e.step_args(1);  // decode_round's plain step
  a.max_keys = recorded_key_bound(pos + 1, e.n_ctx_);
  a.logits = Rows(e.logits_.as<float>(), 1, e.model_->hparams().n_vocab);
  const SamplingParams& sp = options_.sampling;
  const bool sampled = !sp.greedy(), top_k = draws_top_k(sp, a.logits.n_cols);
  Readback& out = *ahead_.token[slot];
  if (sampled) {  // the draw's inputs: the uniform the host's draw of this token would take, in its turn
    TokenDraw in{};
    in.temperature = sp.temperature;
    in.top_k = top_k ? sp.top_k : 0;
    in.top_p = sp.top_p;
    in.min_p = sp.min_p;
    in.uniform = sampler_.uniform();
    constexpr size_t at = offsetof(TokenDraw, temperature);
    out.put(reinterpret_cast<const char*>(&in) + at, sizeof(in) - at, at);
  }
  const auto* fed = static_cast<const int32_t*>(ahead_.token[slot ^ 1]->target());  // a TokenDraw's first field
  void* next = out.target();
  // The drafter's rows of this step, kept in the deferred ring by the step's position (Session::observe): the
  // next step, enqueued before the host observes this one, overwrites the engine's row buffers.
  const bool keep_rows = drafter_ && e.needs_rows();
  StepGraphs::Key key = step_key(a);
  // The slots and the ops after the step are in the graph.
  key[6] = 1 + slot + 2 * sampled + 4 * keep_rows + 8 * top_k;
  ++e.steps_;
  HS_RETURN_IF_ERROR(graphs_.run(key, [&] {
    int32_t* position = ahead_.position.as<int32_t>();
    be.feed_token(fed, const_cast<int32_t*>(a.tokens), const_cast<int32_t*>(a.positions), position);
    const Status st = e.run_forward(a, state_);
    if (keep_rows && a.final_hidden.data)
      be.copy_row_to_ring(a.final_hidden, deferred_.hidden.as<float>(), kDeferredRing, position);
    if (keep_rows && a.features.data)
      be.copy_row_to_ring(a.features, deferred_.features.as<float>(), kDeferredRing, position);
    if (top_k) {
      be.draw_top_k(a.logits, static_cast<TokenDraw*>(next));
    } else if (sampled) {
      be.draw_token(a.logits, static_cast<TokenDraw*>(next));
    } else {
      be.argmax(a.logits, static_cast<int32_t*>(next));
    }
    return st;
  }));
  out.mark();
  ahead_.engine_steps = e.steps_;
  return Status::ok();
}

// A plain round that keeps one step ahead: the step of the token after the pending one is fed from the
// pending one's argmax or draw on the backend and enqueued before the host waits for that token, so the
// device goes from step to step while the host reads back, emits and launches. Not when the pending
// token's output is the last the session may emit (max_tokens, the context); a stop token is seen only
// after its successor's step is enqueued, which then has run the pending token (Session::state). Sampled,
// each step's draw takes the sampler's uniforms in the order the host's draws would (one a token), so a
// seed gives the same tokens either way, but for a draw at a rounding edge on CUDA (backend/chunk_draw.h).
Status Session::look_ahead_round(std::vector<int32_t>& out) {
  Engine& e = engine_;
  Backend& be = *e.backend_;
  const double t_round = e.now();
  const int64_t recordings = graph_stats().recorded;
  if (!ahead_.position.data()) {  // once per session (its graphs hold them)
    HS_ASSIGN_OR_RETURN(ahead_.position, be.alloc(sizeof(int32_t)));
    for (auto& r : ahead_.token) {
      HS_ASSIGN_OR_RETURN(r, be.new_readback(sizeof(TokenDraw)));
    }
  }
  const int slot = ahead_.slot;
  if (!ahead_.in_flight) {  // the pending token's step: its input as if a step before it had made it
    const int32_t before = static_cast<int32_t>(committed_ - 1);
    ahead_.token[slot ^ 1]->put(&tokens_.back(), sizeof(int32_t));
    be.upload(ahead_.position.data(), &before, sizeof(int32_t));
    HS_RETURN_IF_ERROR(enqueue_ahead_step(committed_, slot));
  }
  const bool next = stats_.generated_tokens + 1 < options_.max_tokens &&
                    static_cast<int64_t>(tokens_.size()) + 1 < e.n_ctx_ && next_round_plain();
  if (next) HS_RETURN_IF_ERROR(enqueue_ahead_step(committed_ + 1, slot ^ 1));
  const double t_wait = e.now();
  int32_t got[2] = {0, TokenDraw::kDrawn};  // the token, and a draw's status
  const Status read = ahead_.token[slot]->finish(got, options_.sampling.greedy() ? sizeof(int32_t) : sizeof(got));
  ahead_.in_flight = next;
  ahead_.slot = next ? slot ^ 1 : slot;
  HS_RETURN_IF_ERROR(read);
  const int32_t token = got[0];
  if (got[1] != TokenDraw::kDrawn) return Status::error("the step's logits have no finite probability mass to sample from");
  if (token < 0 || token >= e.model_->hparams().n_vocab)
    return Status::errorf("the step's token {} is outside the vocabulary", token);
  const double t_emit = e.now();
  stats_.verify_wait_s += t_emit - t_wait;
  stats_.verify_s += t_emit - t_round;
  const int32_t ran = tokens_.back();
  emit(token, out, nullptr);
  ++committed_;
  if (drafter_) {  // a plain stretch: its rows are in the deferred ring already
    CommittedRows rows;
    rows.first_pos = committed_ - 1;
    rows.n = 1;
    if (deferred_.hidden.data()) rows.hidden = ring_row(deferred_.hidden, rows.first_pos, e.model_->hparams().n_embd);
    if (deferred_.features.data()) rows.features = ring_row(deferred_.features, rows.first_pos, e.feature_width_);
    rows.row_tokens = {ran};
    rows.next_tokens = {token};
    // Through the deferred rows even when observed now: the drafter reads them from their fixed address.
    HS_RETURN_IF_ERROR(observe(rows, true));
    if (plain_rounds_left_ == 0 && !done()) HS_RETURN_IF_ERROR(observe_deferred());
  }
  const double t_end = e.now();
  stats_.commit_s += t_end - t_emit;
  ++stats_.rounds;
  ++stats_.ahead_rounds;
  if (update_graph_stats(recordings)) {
    e.round_costs_.record_verify(1, t_emit - t_round);
    if (!deferred_.observed_this_round) e.round_costs_.record_commit(1, t_end - t_emit);
    // Plain decoding's rate over the stretch's timed rounds: with a step enqueued ahead, a round waits for what
    // is left of a step, so the fastest round (decode_round's measure) would overstate it.
    if (new_plain_stretch_) ahead_stretch_s_ = 0, ahead_stretch_rounds_ = 0;
    ahead_stretch_s_ += t_end - t_round;
    ++ahead_stretch_rounds_;
    plain_rate_ = ahead_stretch_s_ > 0 ? static_cast<double>(ahead_stretch_rounds_) / ahead_stretch_s_ : 0;
    new_plain_stretch_ = false;
  }
  stats_.decode_s += t_end - t_round;
  return Status::ok();
}

Status Session::check_drafts(const std::vector<int32_t>& drafts) const {
  for (int32_t d : drafts)
    if (d < 0 || d >= engine_.model_->hparams().n_vocab)
      return Status::errorf("drafter '{}' proposed token {} outside the vocabulary", drafter_->name(), d);
  return Status::ok();
}

Status Session::decode_round(std::vector<int32_t>& out) {
  deferred_.observed_this_round = false;
  const int k_max = choose_draft_length();
  if (k_max == 0 && looks_ahead()) return look_ahead_round(out);
  if (ahead_.in_flight) return Status::error("a speculative round after a step enqueued ahead");  // a bug
  Engine& e = engine_;
  Backend& be = *e.backend_;
  const Qwen35Hparams& hp = e.model_->hparams();
  const int64_t V = hp.n_vocab;
  const double t_round = engine_.now();
  const int64_t recordings = graph_stats().recorded;

  // 1. draft. Greedy, a model drafter's drafts stay on the device: they feed the verify step there and come
  // back with its argmaxes, so the device goes from drafting to verifying without waiting for the host.
  const bool plain_greedy = options_.sampling.greedy() && !options_.sampling.has_penalties();
  std::vector<int32_t> drafts;
  Drafter::OnDevice drafts_dev;  // ids: drafts on the device, read back with the verify's argmaxes
  double draft_dt = 0;
  if (k_max > 0) {
    const double t0 = engine_.now();
    HS_RETURN_IF_ERROR(observe_deferred());
    if (plain_greedy && drafter_->drafts_on_device()) {
      HS_ASSIGN_OR_RETURN(drafts_dev, drafter_->propose_on_device(k_max));
      drafts_dev.count = std::clamp(drafts_dev.count, 0, k_max);
    } else {
      HS_ASSIGN_OR_RETURN(drafts, drafter_->propose(k_max));
      if (static_cast<int>(drafts.size()) > k_max) drafts.resize(k_max);
      HS_RETURN_IF_ERROR(check_drafts(drafts));
    }
    draft_dt = engine_.now() - t0;
    stats_.draft_s += draft_dt;
  }
  const int k = drafts_dev.ids ? drafts_dev.count : static_cast<int>(drafts.size());

  // 2. verify [pending, d1..dk] at positions committed_ .. committed_+k, capturing GDN states. With
  // pad_verify, rows n..n_run-1 repeat the last draft at the next positions: they come after every
  // real row, so causal attention, the GDN recurrence and the row-wise ops leave the real rows as they
  // were, their captures are never restored, and their cache entries lie past the committed length,
  // where a later step writes before it reads.
  const double t1 = engine_.now();
  const int64_t n = k + 1;
  const PadVerify pad = e.config_.pad_verify;
  const bool padding = pad == PadVerify::kOn || (pad == PadVerify::kAuto && graphs_.enabled());
  // Every row of the step, padding included, reads keys below the plain step's key bound at committed_
  // (recorded_key_bound, the attention's split layout: AttentionArgs::max_keys), so that each row gets the
  // bits the plain step at its position would (choose_draft_length keeps k within it).
  const int64_t key_bound = recorded_key_bound(committed_ + 1, e.n_ctx_);
  const int64_t n_run = k > 0 && n > 2 && padding
                            ? std::min({(n + 7) / 8 * 8, static_cast<int64_t>(e.max_verify_), e.n_ctx_ - committed_,
                                        key_bound - committed_})
                            : n;
  stats_.padded_rows += n_run - n;
  std::vector<int32_t> window(n_run), pos(n_run);
  window[0] = tokens_.back();
  for (int i = 0; i < static_cast<int>(drafts.size()); ++i) window[i + 1] = drafts[i];
  for (int64_t i = n; i < n_run; ++i) window[i] = window[n - 1];
  for (int64_t i = 0; i < n_run; ++i) pos[i] = static_cast<int32_t>(committed_ + i);
  int32_t* tok_dev = e.ints_.as<int32_t>();
  int32_t* pos_dev = tok_dev + e.model_->reserved_tokens();
  int32_t* arg_dev = pos_dev + e.model_->reserved_tokens();
  be.upload(tok_dev, window.data(), n_run * sizeof(int32_t));
  be.upload(pos_dev, pos.data(), n_run * sizeof(int32_t));
  if (drafts_dev.ids && k > 0) {  // rows 1..k from the drafts, the padding rows repeating the last one
    std::vector<Backend::CopyPart> parts = {{tok_dev + 1, drafts_dev.ids, static_cast<size_t>(k) * sizeof(int32_t)}};
    for (int64_t i = n; i < n_run; ++i) parts.push_back({tok_dev + i, drafts_dev.ids + (k - 1), sizeof(int32_t)});
    be.copy_many(parts.data(), parts.size());
  }
  ForwardArgs a = e.step_args(n_run);
  a.capture = k > 0;
  a.max_keys = key_bound;
  a.logits = Rows(e.logits_.as<float>(), n_run, V);
  HS_RETURN_IF_ERROR(run_step(a));
  const Rows logits = a.logits.rows(0, n);  // the real rows

  // 3. accept: the emitted tokens are the accepted drafts plus one token from the target
  std::vector<int32_t> emitted;
  // The rows stay on the device; sampling and logprobs read back what they need of the rows they reach
  // (a 16-row verify step holds 16 MB of logits for a 248K vocabulary, and sampling stops at the first
  // rejected draft).
  LogitRows rows(be, logits, e.sampling_.data(), sampler_);
  if (plain_greedy) {
    const int64_t read = n + (drafts_dev.ids ? k : 0);  // the argmaxes, then drafts left on the device
    std::vector<int32_t> best(read);
    be.argmax(logits, arg_dev);
    if (drafts_dev.ids && k > 0) be.copy(arg_dev + n, drafts_dev.ids, static_cast<size_t>(k) * sizeof(int32_t));
    const double t_wait = engine_.now();
    be.download(best.data(), arg_dev, read * sizeof(int32_t));
    stats_.verify_wait_s += engine_.now() - t_wait;
    if (drafts_dev.ids) {
      drafts.assign(best.begin() + n, best.end());
      HS_RETURN_IF_ERROR(check_drafts(drafts));
      std::copy(drafts.begin(), drafts.end(), window.begin() + 1);  // the rows the commit reads (row_tokens)
    }
    int i = 0;
    while (i < k && best[i] == drafts[i]) emitted.push_back(drafts[i++]);
    emitted.push_back(best[i]);
  } else {
    std::vector<int32_t> history;  // what the penalties see
    if (options_.sampling.has_penalties()) history = tokens_;
    rows.prefetch_drafts(drafts);  // temperature alone: every row's summary and draft logit in one read-back
    int i = 0;
    for (;; ++i) {
      rows.select(i, history);
      if (i == k) {  // every draft accepted: the bonus token comes straight from the target
        emitted.push_back(rows.draw());
        break;
      }
      // Deterministic draft (q one-hot): accept with probability p(d); otherwise draw from the
      // residual (p - q)+ normalised, i.e. p without d.
      const int32_t d = drafts[i];
      const float pd = rows.p(d);
      if (pd > 0 && (pd >= 1.0f || sampler_.uniform() < pd)) {
        emitted.push_back(d);
        if (!history.empty()) history.push_back(d);
        continue;
      }
      emitted.push_back(rows.draw(d));
      break;
    }
  }
  const int n_accepted = static_cast<int>(emitted.size()) - 1;
  const double verify_dt = engine_.now() - t1;
  stats_.verify_s += verify_dt;

  // 4. emit until a stop condition, then commit exactly what was emitted
  const double t2 = engine_.now();
  int kept = 0;
  for (int32_t t : emitted) {
    emit(t, out, options_.logprobs >= 0 ? rows.host_row(kept) : nullptr);
    ++kept;
    if (done()) break;
  }
  // Rows 0..kept-1 of the window are now committed; the state after row kept-1 is capture slot kept-1.
  if (k > 0) e.model_->restore_captured(state_, kept - 1, static_cast<int>(n_run));
  const int64_t first = committed_;
  committed_ += kept;
  if (drafter_) {
    CommittedRows rows;
    rows.first_pos = first;
    rows.n = kept;
    rows.hidden = a.final_hidden.data ? a.final_hidden.rows(0, kept) : Rows();
    rows.features = a.features.data ? a.features.rows(0, kept) : Rows();
    rows.row_tokens.assign(window.begin(), window.begin() + kept);
    rows.next_tokens.assign(emitted.begin(), emitted.begin() + kept);
    // The next round is plain while a plain stretch lasts (choose_draft_length counts it down); after
    // the last round nothing proposes.
    HS_RETURN_IF_ERROR(observe(rows, k == 0 && (plain_rounds_left_ > 0 || done())));
  }
  const double commit_dt = engine_.now() - t2;
  stats_.commit_s += commit_dt;

  // 5. statistics and adaptation
  ++stats_.rounds;
  const double dt = engine_.now() - t_round;
  const double rate = dt > 0 ? kept / dt : 0;
  if (k > 0) {
    ++stats_.spec_rounds;
    stats_.drafted += k;
    stats_.accepted += n_accepted;
    ++stats_.accept_histogram[std::min(n_accepted, 64)];
    draft_length_.record(k, n_accepted);
  }
  // Rates and costs: a round that recorded a CUDA graph (a new step width, a new draft step, a drafter's
  // new observe width) timed the recording, not the step.
  if (update_graph_stats(recordings)) {
    // A plain stretch's deferred rows, observed in this round's draft or commit phase, are not its cost.
    if (k > 0 && !deferred_.observed_this_round) e.round_costs_.record_draft(k, draft_dt);
    e.round_costs_.record_verify(static_cast<int>(n), verify_dt);
    if (!deferred_.observed_this_round) e.round_costs_.record_commit(kept, commit_dt);
    if (k > 0) {
      ema_spec_rate_ = ema_spec_rate_ == 0 ? rate : 0.8 * ema_spec_rate_ + 0.2 * rate;
      if (probe_rounds_left_ > 0) {
        probe_tokens_ += kept;
        probe_s_ += dt;
        if (--probe_rounds_left_ == 0) {
          const double probe_rate = probe_s_ > 0 ? probe_tokens_ / probe_s_ : 0;
          ema_spec_rate_ = probe_rate;  // what speculation does on this stretch of text, not before
          if (probe_rate >= kSpecWinMargin * plain_rate_) {
            backoff_rounds_ = kMinBackoffRounds;
          } else {
            back_off();
          }
        }
      }
    } else {
      // Plain decoding's rate is the fastest round of the latest plain stretch: a plain round emits one
      // token whatever the text, so a slower one was disturbed (a preempted thread, a cold cache), and
      // one such round among the two that open a sequence made its reference too low to ever back off.
      plain_rate_ = new_plain_stretch_ ? rate : std::max(plain_rate_, rate);
      new_plain_stretch_ = false;
    }
  }
  stats_.decode_s += dt;
  return Status::ok();
}

StepGraphs::Key Session::step_key(const ForwardArgs& args) {
  return {args.n, args.capture, args.logits.n_rows, args.final_hidden.data != nullptr, args.features.data != nullptr,
          args.max_keys, 0};
}

Status Session::run_step(const ForwardArgs& args) {
  ++engine_.steps_;
  return graphs_.run(step_key(args), [this, args] { return engine_.run_forward(args, state_); });
}

bool Session::update_graph_stats(int64_t recordings) {
  const GraphStats graphs = graph_stats();
  stats_.graphs_recorded = graphs.recorded - graphs_at_start_.recorded;
  stats_.graph_record_s = graphs.record_s - graphs_at_start_.record_s;
  return graphs.recorded == recordings;
}

GraphStats Session::graph_stats() const {
  GraphStats s = graphs_.stats();
  if (drafter_) s += drafter_->graph_stats();
  return s;
}

Result<std::vector<float>> Session::probe_next_logits() {
  Engine& e = engine_;
  Backend& be = *e.backend_;
  const int64_t V = e.model_->hparams().n_vocab;
  if (prefilled_ < n_prompt_) return Status::error("probe before the prompt was processed");
  if (ahead_.in_flight) {  // a look-ahead step has run the pending token: its logits are the engine's
    if (e.steps_ != ahead_.engine_steps)
      return Status::error("probe after another session's step overwrote the look-ahead step's logits");
    std::vector<float> logits(V);
    be.download(logits.data(), e.logits_.data(), V * sizeof(float));
    ahead_.in_flight = false;
    finish_ = FinishReason::Cancelled;
    return logits;
  }
  ++e.steps_;
  const int32_t tok = tokens_.back(), pos = static_cast<int32_t>(committed_);
  int32_t* tok_dev = e.ints_.as<int32_t>();
  int32_t* pos_dev = tok_dev + e.model_->reserved_tokens();
  be.upload(tok_dev, &tok, sizeof(int32_t));
  be.upload(pos_dev, &pos, sizeof(int32_t));
  ForwardArgs a;
  a.n = 1;
  a.tokens = tok_dev;
  a.positions = pos_dev;
  a.logits = Rows(e.logits_.as<float>(), 1, V);
  a.max_keys = recorded_key_bound(committed_ + 1, e.n_ctx_);  // a plain step's bits
  HS_RETURN_IF_ERROR(e.run_forward(a, state_));
  std::vector<float> logits(V);
  be.download(logits.data(), e.logits_.data(), V * sizeof(float));
  finish_ = FinishReason::Cancelled;
  return logits;
}

}  // namespace hyspec
