// Server metrics in the Prometheus text format (GET /metrics). Every method may be called from any
// thread.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hyspec::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value, uint64_t times = 1);
  // Appends the _bucket, _sum and _count lines of `name`.
  void render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_response(int http_status);
  void count_finished(const std::string& finish_reason);  // stop, length, cancelled, error
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds, uint64_t tokens);
  // accepted_per_round[i]: speculative rounds in which i drafts were accepted (i + 1 tokens out).
  void observe_acceptance(const std::array<int64_t, 65>& accepted_per_round);
  // Step graphs a request's session recorded (CUDA; a slot's graphs outlive its requests) and the time it took.
  void add_graphs(int64_t recorded, double seconds);
  void set_load(int64_t queue_depth, int64_t active_slots, int64_t slots);
  int64_t active_slots() const;
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> responses_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, graphs_recorded_ = 0;
  double graph_record_s_ = 0;
  int64_t queue_depth_ = 0, active_ = 0, slots_ = 0;
  Histogram ttft_, itl_, acceptance_;
};

}  // namespace hyspec::server
