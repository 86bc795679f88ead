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
#include "cli/engine_options.h"

#ifdef HYSPEC_HAVE_SERVER
#include "server/server.h"
#endif

namespace hyspec::cli {
namespace {

struct ServeOptions {
  EngineFlags engine;
  bool spec_given = false;  // --spec on the command line; otherwise --draft-model alone means dflash
#ifdef HYSPEC_HAVE_SERVER
  server::ServerConfig server;
#endif
};

#ifdef HYSPEC_HAVE_SERVER
int run_serve(ServeOptions& opt) {
  if (!opt.spec_given && !opt.engine.draft_model.empty()) opt.engine.spec = "dflash";
  auto config = opt.engine.to_config();
  if (!config.is_ok()) return fail(config.status());

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
  if (!port.is_ok()) return fail(port.status());
  fmt::print("hyspec serve: listening on http://{}:{}\n", opt.server.host, *port);
  std::fflush(stdout);

  // A signal that arrives while loading is taken once loading is done.
  Status loaded = srv.load(*config);
  if (!loaded.is_ok()) {
    srv.shutdown();
    return fail(loaded);
  }
  fmt::print("hyspec serve: model loaded ({} on {}, speculative: {}, {} slot(s)); ready\n", config->model_path,
             srv.backend_name(), spec_method_name(config->spec), opt.server.parallel);
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
int run_serve(ServeOptions&) { return fail(Status::error("this hyspec was built without the server (cpp-httplib was not found)")); }
#endif

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/SERVER.md)");
  opt->engine.add_to(*cmd);
  cmd->get_option("--model")->required();
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
  cmd->callback([opt, cmd, &exit_code] {
    opt->spec_given = cmd->count("--spec") > 0;
    exit_code = run_serve(*opt);
  });
}

}  // namespace hyspec::cli
