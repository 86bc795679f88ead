// The real `hyspec serve` binary as a subprocess on a free loopback port (--port 0; the port is read
// from its "listening on" line), plus small HTTP helpers for tests.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fixtures.h"

namespace hyspec::test {

inline std::string tiny_model(const std::string& variant = "q8_0") {
  return fixture_path("qwen35-tiny/qwen35-tiny-" + variant + ".gguf");
}

class ServerProcess {
 public:
  // `args` follow "serve"; "--port 0" is added. Waits until /health answers 200.
  explicit ServerProcess(std::vector<std::string> args, double ready_timeout_s = 60) {
    log_path_ = testing::TempDir() + "hyspec_serve_" + std::to_string(getpid()) + "_" + std::to_string(counter()++) + ".log";
    // Emptied before the fork: a log left by an earlier process with this pid must not be read for this
    // server's port before the child gets to truncate it.
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string bin = hyspec_binary();
      std::vector<std::string> all = {bin, "serve", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      // HYSPEC_TEST_BACKEND=cuda serves on the GPU (scripts/device/test.sh).
      if (test_backend_kind() == BackendKind::Cuda && std::find(args.begin(), args.end(), "--backend") == args.end())
        all.insert(all.end(), {"--backend", "cuda"});
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    if (fd >= 0) close(fd);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(ready_timeout_s);
    const std::regex listening(R"(listening on http://[^:]+:(\d+))");
    std::string last_health = "never asked";  // for the failure message
    while (std::chrono::steady_clock::now() < deadline && exited_status() < 0) {
      std::smatch m;
      const std::string log = output();
      if (port_ == 0 && std::regex_search(log, m, listening)) port_ = std::stoi(m[1]);
      if (port_ != 0) {
        httplib::Client c("127.0.0.1", port_);
        c.set_connection_timeout(2);
        c.set_read_timeout(5);
        auto r = c.Get("/health");
        last_health = r ? "HTTP " + std::to_string(r->status) + " " + r->body : "error " + httplib::to_string(r.error());
        if (r && r->status == 200) {
          ready_ = true;
          if (test_backend_kind() == BackendKind::Cuda) expect_served_on_cuda(deadline);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "hyspec serve did not become ready (port " << port_ << ", last /health: " << last_health
                  << "); its output:\n" << output();
  }
  ~ServerProcess() {
    if (exit_status_ < 0 && pid_ > 0) stop(10);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ready() const { return ready_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  httplib::Client client(int read_timeout_s = 60) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }
  std::string output() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // SIGTERM, then the exit code (-1: killed by a signal, or still running after timeout_s: SIGKILL).
  int stop(double timeout_s) {
    if (exit_status_ >= 0 || exit_signalled_) return exit_status_;
    terminate();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited_status() >= 0 || exit_signalled_) return exit_status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    exit_signalled_ = true;
    return -1;
  }
  // Sends SIGTERM once (a second one would make the server exit at once).
  void terminate() {
    if (!terminated_) kill(pid_, SIGTERM);
    terminated_ = true;
  }
  // The exit code if the process has exited (reaping it), else -1.
  int exited_status() {
    if (exit_status_ >= 0 || exit_signalled_) return exit_status_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      if (WIFEXITED(status)) exit_status_ = WEXITSTATUS(status);
      else exit_signalled_ = true;
    }
    return exit_status_;
  }
  // VmRSS of the server in KiB.
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }

 private:
  // The "model loaded (... on BACKEND, ...)" line follows /health turning 200 by a moment.
  template <class TimePoint>
  void expect_served_on_cuda(TimePoint deadline) {
    while (output().find("model loaded") == std::string::npos && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_NE(output().find(" on cuda"), std::string::npos) << output();
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  pid_t pid_ = -1;
  int port_ = 0;
  bool ready_ = false;
  int exit_status_ = -1;
  bool exit_signalled_ = false;
  bool terminated_ = false;
  std::string log_path_;
};

// The value of an unlabelled (or exactly labelled) Prometheus sample, -1 when absent.
inline double metric_value(const std::string& text, const std::string& sample) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  return -1;
}

inline double server_metric(const ServerProcess& server, const std::string& sample) {
  auto r = server.client().Get("/metrics");
  return r && r->status == 200 ? metric_value(r->body, sample) : -2;
}

// Polls a metric until it equals `want` or `timeout_s` passes; returns the last value seen.
inline double wait_for_metric(const ServerProcess& server, const std::string& sample, double want, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  double v = server_metric(server, sample);
  while (v != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = server_metric(server, sample);
  }
  return v;
}

struct HttpReply {
  int status = 0;  // 0: no response
  std::string body;
  nlohmann::json json;  // parsed body when it is JSON
  httplib::Headers headers;
};

inline HttpReply post_json(httplib::Client& c, const std::string& path, const std::string& body,
                           const httplib::Headers& headers = {}) {
  HttpReply out;
  auto r = c.Post(path, headers, body, "application/json");
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  out.json = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  return out;
}

// A streamed POST; `on_data` sees the body as it arrives and returns false to hang up.
inline HttpReply post_stream(httplib::Client& c, const std::string& path, const std::string& body,
                             const std::function<bool(const std::string& so_far)>& on_data) {
  HttpReply out;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.headers = {{"Content-Type", "application/json"}};
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    out.headers = r.headers;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.body.append(data, n);
    return on_data ? on_data(out.body) : true;
  };
  c.send(req);
  return out;
}

// The JSON payloads of the "data: " lines of an SSE body ("[DONE]" is kept as a string).
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
  std::vector<nlohmann::json> events;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string payload = line.substr(6);
    events.push_back(payload == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(payload, nullptr, false));
  }
  return events;
}

}  // namespace hyspec::test
