// The engine: a loaded target model (+ optional drafter weights) on one backend, and sessions that
// each carry one sequence through prefill and decoding — plain or speculative, through one loop:
//
//   drafts  = drafter.propose(k)                        (none: plain decoding)
//   verify  = target.forward([pending] + drafts)        one pass, GDN states captured per token
//   n       = accept(verify logits, drafts, sampler)    greedy prefix / speculative-sampling rule
//   commit  : GDN/conv state = the one after row n (captured, or replayed from captured updates),
//             KV length follows positions, drafter observes rows 0..n
//
// Engine layer only sees token ids; text lives in src/text and is joined in the CLI and server.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/draft_length.h"
#include "engine/sampler.h"
#include "engine/spec/drafter.h"
#include "model/qwen35.h"
#include "engine/step_graphs.h"
#include "model/qwen35.h"

namespace hyspec {

enum class PadVerify { kAuto, kOff, kOn };  // EngineConfig::pad_verify
Result<PadVerify> parse_pad_verify(const std::string& name);  // auto | on | off
enum class LookAhead { kAuto, kOff, kOn };  // EngineConfig::look_ahead
Result<LookAhead> parse_look_ahead(const std::string& name);  // auto | on | off

struct EngineConfig {
  std::string model_path;
  BackendKind backend = BackendKind::Cpu;
  int n_threads = 0;
  int64_t n_ctx = 0;        // 0: min(training context, 8192)
  // Prompt tokens per forward; 0: the backend's default, set by Engine::create (CUDA 512, llama.cpp's
  // default ubatch: a 512-token chunk runs its GEMMs at twice the width of 256 and its logits matmul once;
  // CPU 256).
  int n_batch = 0;
  GgmlType kv_type = GgmlType::F32;
  // What a verify step keeps of each token's GDN state for the rollback (model/qwen35.h StateCapture):
  // Updates (lossless, ~1/d of a state's bytes, replayed on rollback), F32 states (lossless), or F16
  // states (half F32's bytes; a rollback restores rounded states, so speculative output may part from
  // plain decoding). Updates by default: on the 9B Q4_K_M (H100) a 16-row verify step takes 3.57 ms
  // against 3.83 with F32 states, and its capture 9.5 MB instead of 768 MiB (docs/PERFORMANCE.md).
  StateCapture capture = StateCapture::Updates;
  bool dequantize = false;  // every weight to F32 at load
  SpecMethod spec = SpecMethod::None;
  std::string draft_model;  // DFlash drafter: GGUF file or HF directory
  // Most drafted tokens per round. 15: a 16-row verify step; on CUDA a 17th row starts a third 8-token
  // tile of the int8 matvecs (9B Q4_K_M, H100: 16 rows 3.91 ms, 17 rows 4.29), more than a 16th draft,
  // accepted only after 15 others, brings back. DFlash drafts block_size - 1 = 15 anyway.
  int draft_max = 15;
  // The model drafters' (MTP, DFlash on the target's head) output head cut to the first draft_vocab
  // token ids, rounded up to a multiple of 256 (0: the whole vocabulary). An MTP draft step of a 9B
  // reads its 834 MB head; Qwen's ids follow the tokenizer's merge order, so the first ids are the
  // frequent ones (docs/PERFORMANCE.md, session 27: ids < 151643 held every token of English, code,
  // Chinese and European sample texts). Lossless either way: a draft outside it is a rejected draft.
  int64_t draft_vocab = 0;
  bool add_ngram = false;   // compose n-gram lookup with the model drafter (the longer draft wins)
  bool int8_matvec = true;  // CUDA: BackendOptions::int8_matvec
  bool use_graphs = true;   // CUDA: replay recorded decode/verify steps
  // Verify steps of 3+ rows padded to whole 8-row tiles (the int8 matvecs' n-tiles) with rows that change
  // nothing (Session::decode_round), so a session records one step graph per tile count instead of one
  // per width; the padded rows cost their attention, GDN and norm work. Auto: where steps are recorded
  // as graphs (CUDA without --no-graphs). H100 (docs/PERFORMANCE.md, session 42): a 9B's adaptive n-gram
  // loop +15%, the demo models' adaptive MTP-15 / DFlash / n-gram 0.92 / 0.84 / 2.00x -> 1.19 / 0.92 / 2.76x
  // of plain decoding.
  PadVerify pad_verify = PadVerify::kAuto;
  // Look-ahead decoding (Session::look_ahead_round): a session greedy or sampled under temperature alone or a
  // top-k cut (draws_top_k; no penalties, no logprobs) enqueues each plain step (every step without a drafter;
  // a drafter's back-off stretches), fed from the previous step's argmax or draw on the backend
  // (Backend::draw_token, draw_top_k), before it waits for that one, so the host's read-back, emit and launch
  // overlap a step instead of leaving the device idle between steps. Auto: where the backend runs
  // asynchronously (CUDA). H200 (docs/PERFORMANCE.md, sessions 58-60): 9B Q4_K_M greedy sessions 504-507 ->
  // 512.6 t/s, sampled 490-497 -> 510.8 (temperature alone) and 487-489 -> 508-509 (the CLI's top-k 40, top-p
  // 0.95, min-p 0.05); the 35B-A3B-shaped MoE greedy +3-5%, sampled +7-11%.
  LookAhead look_ahead = LookAhead::kAuto;
  // Seconds that sessions time their rounds in (the adaptive draft length and back-off, SessionStats);
  // empty: the steady clock. Tests pass a deterministic one.
  std::function<double()> clock;
};

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  std::set<int32_t> stop_tokens;  // end-of-generation ids (emitted, then generation stops)
  bool speculative = true;        // per-request opt-out
  int draft_max = -1;             // -1: engine default
  bool adaptive = true;           // adapt the draft length, turn speculation off where it loses
  int logprobs = -1;              // >= 0: record each emitted token's logprobs with this many top ids
};

enum class FinishReason { None, Stop, Length, Context, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

struct SessionStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t rounds = 0, spec_rounds = 0, drafted = 0, accepted = 0;
  int64_t ahead_rounds = 0;  // plain rounds run by look-ahead decoding (EngineConfig::look_ahead)
  int64_t padded_rows = 0;  // rows verify steps ran past their drafts (EngineConfig::pad_verify)
  std::array<int64_t, 65> accept_histogram{};  // accepted drafts per speculative round
  double prefill_s = 0, draft_s = 0, verify_s = 0, commit_s = 0, decode_s = 0;
  double verify_wait_s = 0;  // of verify_s: greedy and look-ahead rounds' wait for the device's token (its device time)
  int64_t graphs_recorded = 0;  // step graphs the target and drafter recorded for this sequence (CUDA;
  double graph_record_s = 0;    // a session's graphs outlive it), and the host time it took (in decode_s)
  double mean_acceptance_length() const {  // tokens emitted per speculative round
    return spec_rounds ? static_cast<double>(accepted + spec_rounds) / spec_rounds : 0.0;
  }
};

class Engine;

// One sequence. step() does one unit of work — a prompt chunk or one decoding round — so a
// scheduler can interleave sessions; tokens produced by the step are appended to `out`.
class Session {
 public:
  ~Session();
  Status start(const std::vector<int32_t>& prompt, const GenerateOptions& options);
  Status step(std::vector<int32_t>& out);
  bool done() const { return finish_ != FinishReason::None; }
  FinishReason finish_reason() const { return finish_; }
  void cancel() { if (!done()) finish_ = FinishReason::Cancelled; }
  const SessionStats& stats() const { return stats_; }
  // With options.logprobs >= 0: one entry per emitted token, in order (the target's distribution at
  // that position, the same whether the token came from a draft or not).
  const std::vector<EmittedLogprobs>& logprobs() const { return logprobs_; }
  // Committed tokens plus the pending one (prompt and output).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Logits of the token after the pending one: runs the pending token through the target (tests
  // compare this with plain decoding to check every cache), or reads those of the step look-ahead
  // decoding enqueued for it (an error if another session has stepped since). Ends the session.
  Result<std::vector<float>> probe_next_logits();
  Drafter* drafter() const { return drafter_.get(); }
  // Replace the drafter (tests, embedders); takes effect at the next start(). It must need no more
  // target outputs than the engine's configured drafter.
  void set_drafter(std::unique_ptr<Drafter> d) { drafter_ = std::move(d); }
  // The sequence's cache and recurrent state. After look-ahead decoding stopped at a stop token (or was
  // cancelled), the step enqueued ahead has run the pending token too (probe_next_logits gives its logits).
  SequenceState& state() { return state_; }

 private:
  friend class Engine;
  explicit Session(Engine& engine);
  Status prefill_chunk(std::vector<int32_t>& out);
  // A decode/verify forward: recorded once per shape as a backend graph and replayed (CUDA), so a
  // step costs one launch; every per-step input lives in the engine's fixed device buffers.
  Status run_step(const ForwardArgs& args);
  static StepGraphs::Key step_key(const ForwardArgs& args);  // what shapes a step's graph
  GraphStats graph_stats() const;  // the target's and the drafter's (a round that recorded one is not timed)
  // stats_' graph counts brought up to date; true when none was recorded since `recordings` (a timed round).
  bool update_graph_stats(int64_t recordings);
  Status decode_round(std::vector<int32_t>& out);
  bool looks_ahead() const;  // EngineConfig::look_ahead applies to this sequence's plain rounds
  bool next_round_plain() const;  // the round after this one is surely plain (a step may be enqueued for it)
  Status look_ahead_round(std::vector<int32_t>& out);
  Status check_drafts(const std::vector<int32_t>& drafts) const;  // every draft within the vocabulary
  // One recorded graph: the token in read-back slot^1 and the next position fed into the step buffers, a
  // plain one-token step (at position pos), its argmax or draw into read-back slot `slot`; then that slot
  // marked. Sampled, the draw's uniform is taken from the sampler first.
  Status enqueue_ahead_step(int64_t pos, int slot);
  int choose_draft_length();
  void back_off();  // speculation lost: plain rounds for the current back-off stretch, then double it
  // The drafter's view of committed rows. Within a plain stretch (the next round is plain too) the rows
  // wait in this session's buffers and the drafter observes them in one call (kDeferredRows at most)
  // before it next proposes, so a plain round costs what it costs without a drafter: an MTP head's
  // block or a DFlash injection once per stretch instead of once per token.
  Status observe(const CommittedRows& rows, bool defer);
  Status observe_deferred();
  Status finish_ahead();  // wait for a step enqueued ahead, if any, and forget it
  static Rows ring_row(const Buffer& ring, int64_t pos, int64_t cols);  // the deferred ring's row of position pos
  void emit(int32_t token, std::vector<int32_t>& out, const float* logits_row);

  Engine& engine_;
  SequenceState state_;
  std::unique_ptr<Drafter> drafter_;
  GenerateOptions options_;
  Sampler sampler_{SamplingParams{}};
  std::vector<int32_t> tokens_;
  int64_t n_prompt_ = 0, prefilled_ = 0;
  int64_t committed_ = 0;  // tokens processed by the target (the pending one is tokens_.back())
  FinishReason finish_ = FinishReason::None;
  SessionStats stats_;
  std::vector<EmittedLogprobs> logprobs_;
  StepGraphs graphs_;  // decode and verify steps
  struct DeferredRows {
    // When the drafter needs them: [kDeferredBufferRows, n_embd] / [.., feature width], a ring of kDeferredRing
    // rows by position, then the rows an observe reads (observe_deferred gathers them there)
    Buffer hidden, features;
    CommittedRows rows;       // n rows from first_pos; hidden and features point into the buffers
    bool observed_this_round = false;
  } deferred_;
  GraphStats graphs_at_start_;  // graph_stats() when this sequence started (the graphs outlive it)
  struct AheadSteps {  // look-ahead decoding (look_ahead_round)
    Buffer position;   // [1] on the backend: the position of the last step enqueued (feed_token's counter)
    std::unique_ptr<Readback> token[2];  // each step's TokenDraw (greedy: its token alone), alternately: the next step's input
    int slot = 0;            // the slot of the step that ran, or runs, the pending token
    bool in_flight = false;  // that step is enqueued (the next round reads its token)
    uint64_t engine_steps = 0;  // Engine::steps_ just after it: while equal, its logits are the engine's
  } ahead_;
  // adaptive speculation (choose_draft_length): rates are emitted tokens per second of a round
  DraftLengthPolicy draft_length_;  // this sequence's acceptance by draft position
  double ema_spec_rate_ = 0;
  double plain_rate_ = 0;  // the fastest plain round of the latest plain stretch (decode_round), or its
                           // look-ahead rounds' mean rate (look_ahead_round)
  double ahead_stretch_s_ = 0;          // the latest stretch's timed look-ahead rounds: their time
  int64_t ahead_stretch_rounds_ = 0;    // and count
  bool new_plain_stretch_ = true;  // the next timed plain round starts plain decoding's reference rate
  int plain_rounds_left_ = 0;  // plain rounds before the next probe
  int probe_rounds_left_ = 0;  // speculative rounds left in the running probe
  int backoff_rounds_ = 0;     // the next plain stretch: doubles after each failed probe
  double probe_tokens_ = 0, probe_s_ = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  ~Engine();
  const EngineConfig& config() const { return config_; }
  Qwen35Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const GgufFile& model_file() const { return *file_; }
  int64_t n_ctx() const { return n_ctx_; }
  Result<std::unique_ptr<Session>> new_session();

  // Logits of one prefill over `tokens` in a fresh sequence: every row [n, n_vocab], or only the last.
  Result<std::vector<float>> prompt_logits(const std::vector<int32_t>& tokens, bool all_rows);

  // Benchmark support: median seconds of one target forward of n tokens at KV depth `depth` (after a
  // prefill of `depth` tokens), over `reps` runs; capture = verify mode (per-token GDN states). rollback
  // (with capture, n >= 2): instead, the rollback after such a verify step that keeps n - 1 of its rows
  // (the state becomes the one after row n - 2: a copy of captured states, or a replay of n - 1 updates).
  Result<double> time_forward(int64_t n, int64_t depth, bool capture, int reps, bool rollback = false);

  // Convenience: run a whole generation, calling on_tokens after each step (return false to stop).
  Result<SessionStats> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                const std::function<bool(const std::vector<int32_t>&)>& on_tokens,
                                FinishReason* finish = nullptr);

 private:
  friend class Session;
  Engine() = default;
  Result<std::unique_ptr<Drafter>> make_drafter();
  double now() const;  // config_.clock, or the steady clock
  Status run_forward(const ForwardArgs& args, SequenceState& state);
  // A session step of n rows on the engine's buffers: tokens and positions from the step buffers, and the
  // rows the drafter needs (final hidden, features); the caller sets logits, capture and the key bound.
  ForwardArgs step_args(int64_t n) const;
  bool needs_rows() const;  // the drafter needs rows of the target's outputs (final hidden, features): MTP, DFlash

  EngineConfig config_;
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Qwen35Model> model_;
  std::shared_ptr<void> dflash_;  // the DFlash drafter weights, shared by sessions
  int64_t n_ctx_ = 0;
  int max_verify_ = 1;
  // Backend buffers shared by sessions (they step one at a time).
  Buffer ints_, logits_, hidden_, features_;
  Buffer sampling_;  // LogitRows' scratch for max_verify_ rows
  int64_t feature_width_ = 0;
  DrafterNeeds needs_;
  RoundCosts round_costs_;  // what rounds cost on this engine, measured by its sessions' rounds
  uint64_t steps_ = 0;      // sessions' forwards into logits_ so far (Session::probe_next_logits)
};

}  // namespace hyspec
