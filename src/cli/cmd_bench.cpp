// hyspec bench: llama-bench-style throughput table — pp (prompt), tg (decode, optionally at a KV
// depth) and verify-k (one target pass over k+1 tokens with per-token state capture, the cost of
// verifying k drafts; with --verify-at-depth also at each depth, against that depth's tg step) — as
// markdown or JSON, with the weight bytes each forward reads per second
// (decode_weight_bytes: compare with the memory bandwidth for the decode floor; KV and state bytes not
// counted).
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "model/hparams.h"

namespace hyspec::cli {
namespace {

struct BenchFlags {
  EngineFlags engine;
  int pp = 512, tg = 128, reps = 3;
  std::string depths = "0";
  std::string verify = "";
  bool verify_at_depth = false;  // verify-k also at every depth > 0
  bool json = false;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoll(item));
  return v;
}

int bench(BenchFlags f) {
  auto config = f.engine.to_config();
  if (!config) return fail(config.status());
  std::vector<int64_t> depths, ks;
  try {
    depths = parse_list(f.depths);
    ks = parse_list(f.verify);
  } catch (const std::exception&) {
    return fail(Status::error("--depth / --verify take comma-separated integers"));
  }
  int64_t max_depth = 0;
  for (int64_t d : depths) max_depth = std::max(max_depth, d);
  if (config->n_ctx == 0) config->n_ctx = std::max<int64_t>(f.pp, max_depth + f.tg + 64);
  auto engine = Engine::create(*config);
  if (!engine) return fail(engine.status());
  Engine& e = **engine;
  const int64_t batch = e.config().n_batch;  // resolved: 0 picks the backend's default
  const std::string model = config->model_path.substr(config->model_path.find_last_of('/') + 1);
  const Qwen35Hparams& hp = e.model().hparams();
  const double weight_bytes =  // per forward
      static_cast<double>(decode_weight_bytes(e.model_file(), hp.n_layer, hp.n_expert, hp.n_expert_used).target);

  struct Row {
    std::string test;
    double seconds;  // per forward (pp: whole prompt; tg: per token)
    double tokens;   // tokens per forward
    int64_t forwards = 1;    // forwards in `seconds` (pp: one per batch)
    int64_t ref_depth = 0;   // "x tg step" divides by the tg step at this depth (none timed: 0)
  };
  auto weight_gbps = [&](const Row& r) { return weight_bytes * static_cast<double>(r.forwards) / r.seconds / 1e9; };
  auto per_s = [](double x) { return x > 0 ? fmt::format("{:.2f}", x) : std::string("-"); };
  std::vector<Row> rows;
  std::map<int64_t, double> tg_at;  // tg step by depth
  if (f.pp > 0) {
    auto t = e.time_forward(std::min<int64_t>(f.pp, batch), 0, false, f.reps);
    if (!t) return fail(t.status());
    // A prompt longer than the batch runs in batch-sized forwards at growing depth; time them all.
    double total = 0;
    for (int64_t s = 0; s < f.pp; s += batch) {
      const int64_t n = std::min<int64_t>(batch, f.pp - s);
      auto ts = s == 0 ? t : e.time_forward(n, s, false, f.reps);
      if (!ts) return fail(ts.status());
      total += *ts;
    }
    const int64_t forwards = (f.pp + batch - 1) / batch;
    rows.push_back({fmt::format("pp{}", f.pp), total, static_cast<double>(f.pp), forwards});
  }
  for (int64_t depth : depths) {
    if (f.tg <= 0) break;
    // tg: single-token steps; the median step time at this depth stands for every step of the run.
    auto t = e.time_forward(1, depth, false, f.tg);
    if (!t) return fail(t.status());
    tg_at[depth] = *t;
    rows.push_back({depth ? fmt::format("tg{} @ d{}", f.tg, depth) : fmt::format("tg{}", f.tg), *t, 1.0});
  }
  // verify-k at depth 0, and with --verify-at-depth at every other depth asked for.
  std::vector<int64_t> verify_depths = {0};
  for (int64_t d : depths)
    if (f.verify_at_depth && d > 0) verify_depths.push_back(d);
  for (int64_t depth : verify_depths) {
    for (int64_t k : ks) {
      auto t = e.time_forward(k + 1, depth, true, std::max(f.reps, 8));
      if (!t) return fail(t.status());
      rows.push_back({depth ? fmt::format("verify-{} @ d{}", k, depth) : fmt::format("verify-{}", k), *t,
                      static_cast<double>(k + 1), 1, depth});
    }
  }
  // What a verify round adds after the step: the rollback to its second-last row (a copy of captured
  // states, or a replay of the kept updates with --capture-type updates). No tokens, no weights.
  for (int64_t k : ks) {
    auto t = e.time_forward(k + 1, 0, true, std::max(f.reps, 8), /*rollback=*/true);
    if (!t) return fail(t.status());
    rows.push_back({fmt::format("rollback-{}", k), *t, 0.0, 0});
  }

  auto ratio = [&](const Row& r) {
    const auto ref = tg_at.find(r.ref_depth);
    return ref != tg_at.end() ? r.seconds / ref->second : 0.0;
  };
  if (f.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows)
      j.push_back({{"model", model}, {"backend", e.backend().name()}, {"test", r.test}, {"ms_per_step", r.seconds * 1e3},
                   {"tokens_per_s", r.tokens / r.seconds},
                   {"ratio_to_tg", ratio(r)}, {"weight_gb_per_s", weight_gbps(r)}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| model | backend | test | t/s | ms/step | x tg step | weights GB/s |\n"
              "| --- | --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %.3f | %.2f | %s |\n", model.c_str(), e.backend().name().c_str(),
                r.test.c_str(), per_s(r.tokens / r.seconds).c_str(), r.seconds * 1e3, ratio(r),
                r.forwards ? fmt::format("{:.0f}", weight_gbps(r)).c_str() : "-");
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark prompt, decode and verify throughput");
  f->engine.add_to(*cmd, false);
  cmd->add_option("-p,--n-prompt", f->pp, "Prompt tokens (0: skip)");
  cmd->add_option("-n,--n-gen", f->tg, "Generated tokens (0: skip)");
  cmd->add_option("-r,--repetitions", f->reps, "Repetitions per test");
  cmd->add_option("-d,--depth", f->depths, "KV depths for tg, comma-separated (e.g. 0,4096,16384)");
  cmd->add_option("--verify", f->verify, "Verify widths k, comma-separated (e.g. 1,2,4,8,16,32)");
  cmd->add_flag("--verify-at-depth", f->verify_at_depth,
                "Also time each verify width at every depth > 0 (x tg step: against that depth's tg step)");
  cmd->add_flag("--json", f->json, "JSON output");
  cmd->callback([f, &exit_code] { exit_code = bench(*f); });
}

}  // namespace hyspec::cli
