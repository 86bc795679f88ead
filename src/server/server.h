// `hyspec serve`: an OpenAI-compatible HTTP server over one Engine (docs/SERVER.md).
//
//   HTTP threads (cpp-httplib)          engine thread (Scheduler)
//   parse + validate, render, tokenize ─► bounded queue ─► slots (Sessions), stepped round-robin
//   stream SSE / build the response   ◄─ TokenChannel per request ◄─ detokenize, stop strings
#pragma once
#include <memory>
#include <string>

#include "engine/engine.h"
#include "util/status.h"

namespace hyspec::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port
  std::string api_key;         // non-empty: every route but /health needs "Authorization: Bearer <key>"
  std::string model_name;      // reported by /v1/models and in responses; "" = the model file's stem
  int parallel = 1;            // slots: requests generated at once
  int queue = 64;              // requests waiting for a slot; one more is answered 429
  double shutdown_grace_s = 10;  // on shutdown, running requests may finish for this long
};

class Server {
 public:
  explicit Server(ServerConfig config);
  ~Server();  // shutdown()

  // Binds and starts answering in background threads; returns the bound port. Until load() has
  // finished, /health and the generation routes answer 503.
  Result<int> start();
  // Loads the model and its tokenizer and starts the engine thread; /health turns 200.
  Status load(const EngineConfig& engine_config);
  // The loaded engine's backend, e.g. "cuda:0 NVIDIA H100 80GB HBM3" ("" before load()).
  std::string backend_name() const;
  // Graceful stop: new requests get 503, queued ones fail with 503, running ones may finish within
  // the grace period (then they are cancelled), every open stream is ended with [DONE], then the
  // listener closes. Idempotent; blocks until done.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyspec::server
