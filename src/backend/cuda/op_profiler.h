// Per-op GPU time, for finding where a step's time goes (HYSPEC_CUDA_PROFILE=1). Every op launched
// outside graph capture is bracketed by two events on the backend's stream; the pairs are resolved
// at the next synchronize() and summed per key (op name, or matmul + weight name without its block
// prefix). The table goes to stderr when the backend is destroyed. Steps must run unrecorded
// (--no-graphs) to be seen; the events cost a few microseconds of host time per op, not GPU time.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace hyspec::cuda {

class OpProfiler {
 public:
  static bool requested() {
    const char* e = std::getenv("HYSPEC_CUDA_PROFILE");
    return e && *e && *e != '0';
  }

  // RAII bracket of one op (a matmul's key adds its weight's name); inert, and building no key, when
  // the profiler is off.
  class Scope {
   public:
    Scope(OpProfiler* p, const char* op, const std::string* weight = nullptr) : p_(p) {
      if (p_) p_->begin(weight ? weight_key(op, *weight) : std::string(op));
    }
    ~Scope() {
      if (p_) p_->end();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler* p_;
  };

  explicit OpProfiler(cudaStream_t stream) : stream_(stream) {}
  ~OpProfiler() {
    resolve();
    report();
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }

  // Block prefixes "blk.12." dropped (every one: stacked weights join several names with '+'), so the 32
  // layers' ffn_down add up under one key.
  static std::string weight_key(const char* op, const std::string& name) {
    std::string n;
    for (size_t i = 0; i < name.size();) {
      if (name.compare(i, 4, "blk.") == 0 && (i == 0 || name[i - 1] == '+')) {
        const size_t dot = name.find('.', i + 4);
        if (dot != std::string::npos) {
          i = dot + 1;
          continue;
        }
      }
      n += name[i++];
    }
    return std::string(op) + " " + n;
  }

  // Elapsed times of every finished bracket into the totals (the stream has been synchronized).
  void resolve() {
    for (Pending& p : pending_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
        Total& t = totals_[p.key];
        t.ms += ms;
        ++t.calls;
        t.each.push_back(ms);
      }
      free_.push_back(p.start);
      free_.push_back(p.stop);
    }
    pending_.clear();
    cudaGetLastError();
  }

 private:
  struct Pending {
    std::string key;
    cudaEvent_t start, stop;
  };
  struct Total {
    double ms = 0;
    long calls = 0;
    std::vector<float> each;  // per call: the median ignores first calls (lazy module loads, cuBLAS set-up)
  };

  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    return e;
  }
  void begin(std::string key) {
    open_.key = std::move(key);
    open_.start = event();
    open_.stop = event();
    cudaEventRecord(open_.start, stream_);
  }
  void end() {
    cudaEventRecord(open_.stop, stream_);
    pending_.push_back(open_);
  }
  void report() const {
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double sum = 0;
    for (const auto& r : rows) sum += r.second.ms;
    std::fprintf(stderr, "\nHYSPEC_CUDA_PROFILE: GPU time per op (%.3f ms in all)\n", sum);
    std::fprintf(stderr, "| op | calls | ms | us/call | median us | share |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const auto& [key, t] : rows) {
      std::vector<float> each = t.each;
      std::nth_element(each.begin(), each.begin() + each.size() / 2, each.end());
      std::fprintf(stderr, "| %s | %ld | %.3f | %.2f | %.2f | %.1f%% |\n", key.c_str(), t.calls, t.ms,
                   1000.0 * t.ms / t.calls, 1000.0 * each[each.size() / 2], sum > 0 ? 100.0 * t.ms / sum : 0.0);
    }
  }

  cudaStream_t stream_;
  Pending open_{};
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
};

}  // namespace hyspec::cuda
