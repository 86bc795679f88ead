#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "server/channel.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "server/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace hyspec::server {

using ojson = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_json(e));
}

ApiError unavailable(const std::string& message, const std::string& code) {
  return ApiError{503, message, "server_error", "", code};
}

// How long an idle stream waits between checks that its client is still there.
constexpr auto kStreamPoll = 250ms;
constexpr int kKeepAliveEvery = 8;  // polls: an SSE comment every ~2 s of silence

// One streamed response: what its content provider keeps between calls.
struct StreamState {
  StreamState(std::shared_ptr<CompletionRequest> r, std::shared_ptr<TokenChannel> c, ResponseContext ctx)
      : request(std::move(r)), channel(std::move(c)), formatter(std::move(ctx)) {}
  std::shared_ptr<CompletionRequest> request;  // ctx points into it
  std::shared_ptr<TokenChannel> channel;
  StreamFormatter formatter;
  bool begun = false;
  int idle_polls = 0;
  std::vector<StreamEvent> events;
  std::atomic<bool> released{false};
};

// One call of the content provider: the first chunk, or the events that arrived (waiting up to
// kStreamPoll). Returns false when the client is gone.
bool write_stream(StreamState& state, httplib::DataSink& sink) {
  if (!state.begun) {
    state.begun = true;
    const std::string first = state.formatter.begin();
    return first.empty() || sink.write(first.data(), first.size());
  }
  state.events.clear();
  if (!state.channel->pop(state.events, kStreamPoll)) {
    if (++state.idle_polls < kKeepAliveEvery) return sink.is_writable();
    state.idle_polls = 0;
    static const std::string keep_alive = ": keep-alive\n\n";
    return sink.write(keep_alive.data(), keep_alive.size());
  }
  state.idle_polls = 0;
  for (const StreamEvent& e : state.events) {
    const std::string frames = state.formatter.on_event(e);
    if (!frames.empty() && !sink.write(frames.data(), frames.size())) return false;
    if (e.final || !e.error.empty()) {
      sink.done();
      return true;
    }
  }
  return true;
}

}  // namespace

struct Server::Impl {
  ServerConfig config;
  httplib::Server http;
  std::thread listener;
  Metrics metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Scheduler> scheduler;  // after engine and tokenizer: destroyed first
  std::set<int32_t> end_tokens;
  std::string model_name;
  int64_t started_at = std::time(nullptr);
  std::atomic<bool> ready{false}, draining{false};
  std::mutex shutdown_mu;
  bool shut_down = false;
  // Streams whose content provider has not been released yet.
  std::mutex streams_mu;
  std::condition_variable streams_cv;
  int open_streams = 0;

  void routes();
  bool authorized(const httplib::Request& req) const;
  void handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void stream_response(httplib::Response& res, std::shared_ptr<CompletionRequest> request,
                       std::shared_ptr<TokenChannel> channel, ResponseContext ctx);
  ojson model_card() const;
};

Server::Server(ServerConfig config) : impl_(std::make_unique<Impl>()) { impl_->config = std::move(config); }

Server::~Server() { shutdown(); }

bool Server::Impl::authorized(const httplib::Request& req) const {
  if (config.api_key.empty() || req.path == "/health") return true;
  return req.get_header_value("Authorization") == "Bearer " + config.api_key;
}

ojson Server::Impl::model_card() const {
  ojson meta = ojson::object();
  if (engine) {
    meta["n_ctx"] = engine->n_ctx();
    meta["n_vocab"] = engine->model().hparams().n_vocab;
    meta["spec_method"] = spec_method_name(engine->config().spec);
    meta["parallel"] = config.parallel;
  }
  return ojson{{"id", model_name}, {"object", "model"}, {"created", started_at}, {"owned_by", "hyspec"}, {"meta", meta}};
}

void Server::Impl::routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError{401, "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                             "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string message = res.status == 404 ? "Unknown route: " + req.method + " " + req.path
                                                  : "HTTP error " + std::to_string(res.status);
    send_error(res, ApiError{res.status, message, "invalid_request_error", "", res.status == 404 ? "not_found" : ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError{500, "Internal server error: " + what, "server_error", "", ""});
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) { metrics.count_response(res.status); });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) return send_json(res, 503, {{"status", "shutting down"}});
    if (!ready) return send_json(res, 503, {{"status", "loading"}});
    send_json(res, 200, {{"status", "ok"}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready) return send_error(res, unavailable("The model is still loading.", "loading"));
    send_json(res, 200, {{"object", "list"}, {"data", ojson::array({model_card()})}});
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!ready) return send_error(res, unavailable("The model is still loading.", "loading"));
    if (req.matches[1] != model_name)
      return send_error(res, ApiError{404, "The model '" + std::string(req.matches[1]) + "' does not exist; this server serves '" +
                                               model_name + "'.", "invalid_request_error", "model", "model_not_found"});
    send_json(res, 200, model_card());
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Endpoint::Chat);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Endpoint::Completion);
  });
}

void Server::Impl::handle_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  if (draining) return send_error(res, unavailable("The server is shutting down.", "shutting_down"));
  if (!ready) return send_error(res, unavailable("The model is still loading.", "loading"));
  ojson body;
  try {
    body = ojson::parse(req.body);
  } catch (const ojson::parse_error& e) {
    return send_error(res, ApiError{400, std::string("Invalid JSON body: ") + e.what(), "invalid_request_error", "", "invalid_json"});
  }
  auto request = std::make_shared<CompletionRequest>();
  if (auto err = parse_request(body, endpoint, *request)) return send_error(res, *err);

  std::vector<int32_t> prompt;
  if (endpoint == Endpoint::Chat) {
    auto text = render_chat_template(request->messages, request->template_options);
    if (!text.is_ok())
      return send_error(res, ApiError{400, "Invalid 'messages': " + text.message(), "invalid_request_error", "messages", "invalid_value"});
    prompt = tokenizer->encode(*text, /*parse_special=*/true);
  } else if (request->prompt_ids) {
    prompt = *request->prompt_ids;
    const int64_t n_vocab = engine->model().hparams().n_vocab;
    for (int32_t id : prompt)
      if (id >= n_vocab)
        return send_error(res, ApiError{400, fmt::format("Invalid 'prompt': token id {} is outside the vocabulary (0..{}).", id, n_vocab - 1),
                                        "invalid_request_error", "prompt", "invalid_value"});
  } else {
    prompt = tokenizer->encode(request->prompt, /*parse_special=*/true);
  }
  if (prompt.empty())
    return send_error(res, ApiError{400, "The prompt is empty.", "invalid_request_error", endpoint == Endpoint::Chat ? "messages" : "prompt", "invalid_value"});
  const int64_t n_ctx = engine->n_ctx(), n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= n_ctx)
    return send_error(res, ApiError{400, fmt::format("This model's maximum context length is {} tokens, but the prompt has {} tokens: "
                                                     "{} tokens too many (one position must remain for the reply).",
                                                     n_ctx, n_prompt, n_prompt - n_ctx + 1),
                                    "invalid_request_error", endpoint == Endpoint::Chat ? "messages" : "prompt",
                                    "context_length_exceeded"});

  Job job;
  job.prompt = prompt;
  job.stop = request->stop;
  job.channel = std::make_shared<TokenChannel>();
  GenerateOptions& o = job.options;
  o.max_tokens = static_cast<int>(std::min<int64_t>(request->max_tokens.value_or(n_ctx), n_ctx - n_prompt));
  o.sampling = request->sampling;
  if (!request->seed_given) o.sampling.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  if (!request->ignore_eos) o.stop_tokens = end_tokens;
  o.speculative = request->speculative;
  o.logprobs = request->logprobs;

  ResponseContext ctx;
  ctx.request = request.get();
  ctx.tokenizer = tokenizer.get();
  ctx.id = random_id(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  ctx.created = std::time(nullptr);
  ctx.model = model_name;
  ctx.spec_method = request->speculative ? spec_method_name(engine->config().spec) : "none";
  ctx.prompt_ids = std::move(prompt);

  std::shared_ptr<TokenChannel> channel = job.channel;
  switch (scheduler->submit(std::move(job))) {
    case Scheduler::Admission::Accepted: break;
    case Scheduler::Admission::QueueFull:
      return send_error(res, ApiError{429, "The server is busy: every slot is taken and the queue is full; retry later.",
                                      "rate_limit_error", "", "queue_full"});
    case Scheduler::Admission::ShuttingDown:
      return send_error(res, unavailable("The server is shutting down.", "shutting_down"));
  }
  if (request->stream) return stream_response(res, std::move(request), std::move(channel), std::move(ctx));

  // Not streamed: wait for the whole generation.
  Generation g;
  std::vector<StreamEvent> events;
  while (!g.final.final) {
    events.clear();
    channel->pop(events, 1s);
    for (const StreamEvent& e : events) g.add(e);
  }
  if (!g.final.error.empty())
    return send_error(res, ApiError{g.final.error_status, g.final.error,
                                    g.final.error_status < 500 ? "invalid_request_error" : "server_error", "", ""});
  send_json(res, 200, completion_response(ctx, g));
}

void Server::Impl::stream_response(httplib::Response& res, std::shared_ptr<CompletionRequest> request,
                                   std::shared_ptr<TokenChannel> channel, ResponseContext ctx) {
  auto state = std::make_shared<StreamState>(std::move(request), std::move(channel), std::move(ctx));
  {
    std::lock_guard<std::mutex> lock(streams_mu);
    ++open_streams;
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // A write that fails, or a provider that returns false, ends the response; the releaser then
  // cancels the request, which frees its slot at the engine thread's next turn.
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) {
        try {
          return write_stream(*state, sink);
        } catch (const std::exception&) {
          return false;  // ends the response; the releaser cancels the request
        }
      },
      [this, state](bool) {
        if (state->released.exchange(true)) return;
        state->channel->cancel();  // no-op when generation already ended
        std::lock_guard<std::mutex> lock(streams_mu);
        --open_streams;
        streams_cv.notify_all();
      });
}

Result<int> Server::start() {
  Impl& s = *impl_;
  const int threads = std::clamp(s.config.parallel + s.config.queue + 8, 8, 512);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.http.set_payload_max_length(64u << 20);
  s.http.set_keep_alive_timeout(5);
  s.routes();
  int port = s.config.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.config.host);
    if (port <= 0) return Status::errorf("cannot bind {}:0 (any port)", s.config.host);
  } else if (!s.http.bind_to_port(s.config.host, port)) {
    return Status::errorf("cannot bind {}:{} (in use, or not an address of this machine?)", s.config.host, port);
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  return port;
}

Status Server::load(const EngineConfig& engine_config) {
  Impl& s = *impl_;
  auto engine = Engine::create(engine_config);
  if (!engine.is_ok()) return engine.status().with_context("loading " + engine_config.model_path);
  s.engine = std::move(engine).value();
  auto tokenizer = Tokenizer::from_gguf(s.engine->model_file());
  if (!tokenizer.is_ok()) return tokenizer.status();
  s.tokenizer = std::move(tokenizer).value();
  for (int32_t id = 0; id < s.tokenizer->n_vocab(); ++id)
    if (s.tokenizer->is_end_of_generation(id)) s.end_tokens.insert(id);
  s.model_name = s.config.model_name.empty() ? std::filesystem::path(engine_config.model_path).stem().string()
                                             : s.config.model_name;
  s.scheduler = std::make_unique<Scheduler>(*s.engine, *s.tokenizer, s.metrics);
  HS_RETURN_IF_ERROR(s.scheduler->start(s.config.parallel, s.config.queue));
  s.ready = true;
  return Status::ok();
}

std::string Server::backend_name() const { return impl_->engine ? impl_->engine->backend().name() : ""; }

void Server::shutdown() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.shutdown_mu);
  if (s.shut_down) return;
  s.shut_down = true;
  s.draining = true;
  if (s.scheduler) s.scheduler->shutdown(std::chrono::milliseconds(static_cast<int64_t>(s.config.shutdown_grace_s * 1000)));
  {
    // Every request has its final event now; give the streams a moment to write it.
    std::unique_lock<std::mutex> streams(s.streams_mu);
    s.streams_cv.wait_for(streams, 5s, [&] { return s.open_streams == 0; });
  }
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

}  // namespace hyspec::server
