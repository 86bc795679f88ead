// `hyspec serve -m MODEL.gguf`: the OpenAI-compatible HTTP server (docs/SERVER.md). SIGINT and
// SIGTERM shut it down gracefully (exit 0); a second signal exits at once.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "engine/engine.h"

#ifdef HYSPEC_HAVE_SERVER
#include "server/server.h"
#endif

namespace hyspec::cli {
namespace {

struct ServeOptions {
  EngineConfig engine;
  std::string backend = "cpu";
  std::string spec = "auto";
#ifdef HYSPEC_HAVE_SERVER
  server::ServerConfig server;
#endif
};

#ifdef HYSPEC_HAVE_SERVER
int run_serve(ServeOptions& opt) {
  auto backend = parse_backend_kind(opt.backend);
  if (!backend.is_ok()) {
    fmt::print(stderr, "error: {}\n", backend.message());
    return 1;
  }
  opt.engine.backend = *backend;
  if (opt.spec == "auto") {
    opt.engine.spec = opt.engine.draft_model.empty() ? SpecMethod::None : SpecMethod::Dflash;
  } else {
    auto spec = parse_spec_method(opt.spec);
    if (!spec.is_ok()) {
      fmt::print(stderr, "error: {}\n", spec.message());
      return 1;
    }
    opt.engine.spec = *spec;
  }

  // Signals go to one waiting thread, never to a thread in the middle of a request: block them
  // before any thread exists (threads inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  server::Server srv(opt.server);
  auto port = srv.start();
  if (!port.is_ok()) {
    fmt::print(stderr, "error: {}\n", port.message());
    return 1;
  }
  fmt::print("hyspec serve: listening on http://{}:{}\n", opt.server.host, *port);
  std::fflush(stdout);

  // A signal that arrives while loading is taken once loading is done.
  Status loaded = srv.load(opt.engine);
  if (!loaded.is_ok()) {
    fmt::print(stderr, "error: {}\n", loaded.message());
    srv.shutdown();
    return 1;
  }
  fmt::print("hyspec serve: model loaded ({}, speculative: {}, {} slot(s)); ready\n", opt.engine.model_path,
             spec_method_name(opt.engine.spec), opt.server.parallel);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  fmt::print("hyspec serve: {} received, shutting down (a second signal exits at once)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  std::thread second([signals] {
    int again = 0;
    sigwait(&signals, &again);
    std::_Exit(1);
  });
  second.detach();
  srv.shutdown();
  fmt::print("hyspec serve: stopped\n");
  std::fflush(stdout);
  return 0;
}
#else
int run_serve(ServeOptions&) {
  fmt::print(stderr, "error: this hyspec was built without the server (cpp-httplib was not found)\n");
  return 1;
}
#endif

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/SERVER.md)");
  cmd->add_option("-m,--model", opt->engine.model_path, "target model GGUF")->required();
  cmd->add_option("-c,--ctx", opt->engine.n_ctx, "context length per slot (0: min(training context, 8192))");
  cmd->add_option("--threads", opt->engine.n_threads, "CPU threads (0: all cores)");
  cmd->add_option("--backend", opt->backend, "cpu | cuda")->capture_default_str();
  cmd->add_option("--batch", opt->engine.n_batch, "prompt tokens per forward (prefill chunk)")->capture_default_str();
  cmd->add_option("--spec", opt->spec, "speculative decoding: auto (dflash with --draft-model, else none) | dflash | mtp | ngram | none")
      ->capture_default_str();
  cmd->add_option("--draft-model", opt->engine.draft_model, "DFlash drafter: GGUF file or HF directory");
  cmd->add_option("--draft-max", opt->engine.draft_max, "most drafted tokens per round")->capture_default_str();
#ifdef HYSPEC_HAVE_SERVER
  server::ServerConfig& s = opt->server;
  cmd->add_option("--host", s.host, "address to bind")->capture_default_str();
  cmd->add_option("--port", s.port, "port to bind (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--alias", s.model_name, "model name to report (default: the model file's stem)");
  cmd->add_option("--parallel", s.parallel, "slots: requests generated at once")->capture_default_str();
  cmd->add_option("--queue", s.queue, "requests that may wait for a slot; more are answered 429")->capture_default_str();
  cmd->add_option("--shutdown-grace", s.shutdown_grace_s, "seconds running requests may finish after SIGINT/SIGTERM")
      ->capture_default_str();
#endif
  cmd->callback([opt, &exit_code] { exit_code = run_serve(*opt); });
}

}  // namespace hyspec::cli
