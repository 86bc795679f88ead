#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace hyspec::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t times) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      acceptance_({1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 65}) {}

void Metrics::count_response(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[http_status];
}

void Metrics::count_finished(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[finish_reason];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generated_tokens_ += static_cast<uint64_t>(generated);
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_inter_token_latency(double seconds, uint64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds, tokens);
}

void Metrics::observe_acceptance(const std::array<int64_t, 65>& accepted_per_round) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < accepted_per_round.size(); ++i)
    if (accepted_per_round[i] > 0) acceptance_.observe(static_cast<double>(i + 1), static_cast<uint64_t>(accepted_per_round[i]));
}

void Metrics::add_graphs(int64_t recorded, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  graphs_recorded_ += static_cast<uint64_t>(std::max<int64_t>(recorded, 0));
  graph_record_s_ += std::max(seconds, 0.0);
}

void Metrics::set_load(int64_t queue_depth, int64_t active_slots, int64_t slots) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = queue_depth;
  active_ = active_slots;
  slots_ = slots;
}

int64_t Metrics::active_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP hyspec_http_requests_total HTTP responses by status code.\n# TYPE hyspec_http_requests_total counter\n";
  for (const auto& [status, n] : responses_) out += fmt::format("hyspec_http_requests_total{{code=\"{}\"}} {}\n", status, n);
  out += "# HELP hyspec_requests_finished_total Generation requests that ended, by reason.\n"
         "# TYPE hyspec_requests_finished_total counter\n";
  for (const auto& [reason, n] : finished_) out += fmt::format("hyspec_requests_finished_total{{reason=\"{}\"}} {}\n", reason, n);
  out += fmt::format(
      "# HELP hyspec_prompt_tokens_total Prompt tokens processed.\n# TYPE hyspec_prompt_tokens_total counter\n"
      "hyspec_prompt_tokens_total {}\n"
      "# HELP hyspec_generation_tokens_total Tokens generated.\n# TYPE hyspec_generation_tokens_total counter\n"
      "hyspec_generation_tokens_total {}\n"
      "# HELP hyspec_queue_depth Requests waiting for a slot.\n# TYPE hyspec_queue_depth gauge\nhyspec_queue_depth {}\n"
      "# HELP hyspec_active_slots Slots running a request.\n# TYPE hyspec_active_slots gauge\nhyspec_active_slots {}\n"
      "# HELP hyspec_slots Slots (--parallel).\n# TYPE hyspec_slots gauge\nhyspec_slots {}\n"
      "# HELP hyspec_step_graphs_recorded_total Decode/verify/draft steps recorded as CUDA graphs.\n"
      "# TYPE hyspec_step_graphs_recorded_total counter\nhyspec_step_graphs_recorded_total {}\n"
      "# HELP hyspec_step_graph_record_seconds_total Host time spent recording them.\n"
      "# TYPE hyspec_step_graph_record_seconds_total counter\nhyspec_step_graph_record_seconds_total {}\n",
      prompt_tokens_, generated_tokens_, queue_depth_, active_, slots_, graphs_recorded_, graph_record_s_);
  ttft_.render("hyspec_time_to_first_token_seconds", "From arrival to the first generated token.", out);
  itl_.render("hyspec_inter_token_latency_seconds", "Time per generated token after the first.", out);
  acceptance_.render("hyspec_acceptance_length", "Tokens emitted per speculative round (accepted drafts + 1).", out);
  return out;
}

}  // namespace hyspec::server
