#include "server/scheduler.h"

#include <exception>

namespace hyspec::server {

namespace {
const char* metric_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: case FinishReason::Context: return "length";
    case FinishReason::Cancelled: return "cancelled";
    default: return "error";
  }
}
}  // namespace

Scheduler::Scheduler(Engine& engine, const Tokenizer& tokenizer, Metrics& metrics)
    : engine_(engine), tokenizer_(tokenizer), metrics_(metrics) {}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

Status Scheduler::start(int n_slots, int queue_capacity) {
  if (n_slots < 1) return Status::errorf("--parallel {} must be at least 1", n_slots);
  if (queue_capacity < 0) return Status::errorf("--queue {} must not be negative", queue_capacity);
  slots_.resize(static_cast<size_t>(n_slots));
  for (Slot& s : slots_) {
    auto session = engine_.new_session();
    if (!session.is_ok()) return session.status().with_context("creating a slot");
    s.session = std::move(session).value();
  }
  queue_capacity_ = static_cast<size_t>(queue_capacity);
  std::lock_guard<std::mutex> lock(mu_);
  publish_load_locked();
  thread_ = std::thread([this] { run(); });
  running_ = true;
  return Status::ok();
}

Scheduler::Admission Scheduler::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !running_) return Admission::ShuttingDown;
    const size_t free_slots = slots_.size() - static_cast<size_t>(active_);
    if (queue_.size() >= queue_capacity_ + free_slots) return Admission::QueueFull;
    queue_.push_back(std::move(job));
    publish_load_locked();
  }
  cv_.notify_one();
  return Admission::Accepted;
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      deadline_ = std::chrono::steady_clock::now() + grace;
      for (Job& job : queue_) {
        StreamEvent e;
        e.final = true;
        e.error = "the server is shutting down";
        e.error_status = 503;
        job.channel->push(std::move(e));
      }
      queue_.clear();
      publish_load_locked();
    }
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Scheduler::publish_load_locked() {
  metrics_.set_load(static_cast<int64_t>(queue_.size()), active_, static_cast<int64_t>(slots_.size()));
}

void Scheduler::run() {
  for (;;) {
    bool cancel_all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (Slot& s : slots_) {
        if (s.job || queue_.empty()) continue;
        s.job = std::move(queue_.front());
        queue_.pop_front();
        s.started = s.first_token = false;
        s.logprobs_seen = 0;
        s.completion_tokens = 0;
        ++active_;
      }
      publish_load_locked();
      if (active_ == 0) {
        if (stopping_) return;
        cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        continue;
      }
      cancel_all = stopping_ && std::chrono::steady_clock::now() >= deadline_;
    }
    // One turn per active slot, in slot order.
    for (Slot& s : slots_) {
      if (!s.job) continue;
      if (cancel_all) {
        finish_slot(s, FinishReason::Cancelled, "the server is shutting down", 503);
        continue;
      }
      try {
        step_slot(s);
      } catch (const std::exception& e) {
        finish_slot(s, FinishReason::Error, std::string("internal error: ") + e.what());
      }
    }
  }
}

void Scheduler::step_slot(Slot& s) {
  Job& job = *s.job;
  Session& session = *s.session;
  if (job.channel->cancelled()) {
    session.cancel();
    finish_slot(s, FinishReason::Cancelled);
    return;
  }
  if (!s.started) {
    Status st = session.start(job.prompt, job.options);
    if (!st.is_ok()) {
      finish_slot(s, FinishReason::Error, st.message(), 400);
      return;
    }
    s.started = true;
    s.text.emplace(tokenizer_, job.stop);
    metrics_.add_tokens(static_cast<int64_t>(job.prompt.size()), 0);
  }
  std::vector<int32_t> out;
  if (!session.done()) {
    Status st = session.step(out);
    if (!st.is_ok()) {
      finish_slot(s, FinishReason::Error, "generation failed: " + st.message());
      return;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  if (!out.empty()) {
    if (!s.first_token) {
      metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - job.arrived).count());
      s.first_token = true;
    } else {
      const double dt = std::chrono::duration<double>(now - s.last_output).count();
      metrics_.observe_inter_token_latency(dt / static_cast<double>(out.size()), out.size());
    }
    s.last_output = now;
  }
  // Tokens after an end token or a completed stop string are dropped (a speculative round may
  // emit several at once).
  const std::vector<EmittedLogprobs>& logprobs = session.logprobs();
  bool ended = false;
  int64_t consumed = 0;
  for (size_t i = 0; i < out.size() && !ended; ++i) {
    ++consumed;
    if (job.options.stop_tokens.count(out[i])) {
      ended = true;
      break;
    }
    const size_t li = s.logprobs_seen + i;
    ended = s.text->push(out[i], li < logprobs.size() ? &logprobs[li] : nullptr);
  }
  s.logprobs_seen += out.size();
  s.completion_tokens += consumed;
  metrics_.add_tokens(0, consumed);
  if (ended || session.done()) {
    FinishReason reason = s.text->stopped() ? FinishReason::Stop : session.finish_reason();
    if (ended && !s.text->stopped()) reason = FinishReason::Stop;  // end-of-generation token
    if (!s.text->stopped()) s.text->finish();
    session.cancel();
    finish_slot(s, reason);
    return;
  }
  StreamEvent e;
  s.text->take(e);
  if (!e.text.empty() || !e.tokens.empty()) job.channel->push(std::move(e));
}

void Scheduler::finish_slot(Slot& s, FinishReason reason, const std::string& error, int status) {
  Job& job = *s.job;
  StreamEvent e;
  e.final = true;
  e.finish = reason;
  if (error.empty() && s.text) s.text->take(e);
  e.error = error;
  e.error_status = status;
  e.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  e.completion_tokens = s.completion_tokens;
  if (s.started) {
    e.stats = s.session->stats();
    metrics_.observe_acceptance(e.stats.accept_histogram);
    metrics_.add_graphs(e.stats.graphs_recorded, e.stats.graph_record_s);
  }
  metrics_.count_finished(metric_reason(reason));
  job.channel->push(std::move(e));
  s.job.reset();
  s.text.reset();
  std::lock_guard<std::mutex> lock(mu_);
  --active_;
  publish_load_locked();
}

}  // namespace hyspec::server
