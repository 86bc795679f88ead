// hyspec run: generate from a prompt, streaming text (or ids) as it is produced, then the speed and,
// with a drafter, the acceptance statistics and time per phase.
#include <chrono>
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace hyspec::cli {
namespace {

struct RunFlags {
  EngineFlags engine;
  std::string prompt;
  std::string token_list;
  int n_predict = 128;
  bool chat = false;
  bool no_think = false;
  bool ids = false;
  bool quiet_stats = false;
  bool no_spec_adapt = false;
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
};

Result<std::vector<int32_t>> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return Status::errorf("--tokens: '{}' is not a token id", item);
    }
  }
  if (ids.empty()) return Status::error("--tokens: no token ids given");
  return ids;
}

int run(const RunFlags& f) {
  auto config = f.engine.to_config();
  if (!config) return fail(config.status());
  auto engine = Engine::create(*config);
  if (!engine) return fail(engine.status());
  Engine& e = **engine;
  auto tokenizer = Tokenizer::from_gguf(e.model_file());
  if (!tokenizer && !f.ids) return fail(tokenizer.status());

  std::vector<int32_t> prompt;
  if (!f.token_list.empty()) {
    auto ids = parse_ids(f.token_list);
    if (!ids) return fail(ids.status());
    prompt = *ids;
  } else {
    if (!tokenizer) return fail(tokenizer.status());
    std::string text = f.prompt;
    if (f.chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      messages.push_back({{"role", "user"}, {"content", f.prompt}});
      ChatTemplateOptions o;
      o.add_generation_prompt = true;
      if (f.no_think) o.enable_thinking = false;
      auto rendered = render_chat_template(messages, o);
      if (!rendered) return fail(rendered.status());
      text = *rendered;
    }
    prompt = (*tokenizer)->encode(text, /*parse_special=*/true);
  }

  GenerateOptions o;
  o.max_tokens = f.n_predict;
  o.sampling.temperature = f.temp;
  o.sampling.top_k = f.top_k;
  o.sampling.top_p = f.top_p;
  o.sampling.min_p = f.min_p;
  o.sampling.repeat_penalty = f.repeat_penalty;
  o.sampling.presence_penalty = f.presence_penalty;
  o.sampling.frequency_penalty = f.frequency_penalty;
  o.sampling.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed)
                                : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  o.adaptive = !f.no_spec_adapt;
  if (tokenizer) {
    for (int32_t id = 0; id < (*tokenizer)->n_vocab(); ++id)
      if ((*tokenizer)->is_end_of_generation(id)) o.stop_tokens.insert(id);
  }

  std::optional<TokenStreamDecoder> decoder;
  if (tokenizer && !f.ids) decoder.emplace(**tokenizer);
  if (decoder && f.token_list.empty()) {  // echo the prompt, as llama.cpp does
    std::fputs(f.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  bool first_id = true;
  FinishReason finish = FinishReason::None;
  auto stats = e.generate(prompt, o, [&](const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
      if (f.ids) {
        std::printf(first_id ? "%d" : " %d", t);
        first_id = false;
      } else if (!o.stop_tokens.count(t)) {
        std::fputs(decoder->push(t).c_str(), stdout);
      }
    }
    std::fflush(stdout);
    return true;
  }, &finish);
  if (decoder) std::fputs(decoder->flush().c_str(), stdout);
  std::fputs("\n", stdout);
  if (!stats) return fail(stats.status());
  if (f.quiet_stats) return 0;
  const SessionStats& s = *stats;
  std::fprintf(stderr, "\nprompt: %lld tokens in %.3f s (%.1f t/s)\n", static_cast<long long>(s.prompt_tokens),
               s.prefill_s, s.prefill_s > 0 ? s.prompt_tokens / s.prefill_s : 0.0);
  const int64_t gen = s.generated_tokens > 0 ? s.generated_tokens - 1 : 0;  // the first comes with the prompt
  std::fprintf(stderr, "generation: %lld tokens in %.3f s (%.1f t/s), finish: %s, backend: %s\n",
               static_cast<long long>(s.generated_tokens), s.decode_s, s.decode_s > 0 ? gen / s.decode_s : 0.0,
               finish_reason_name(finish), e.backend().name().c_str());
  if (s.graphs_recorded > 0) {
    // Recording is a one-time cost of a step shape (a server slot keeps its graphs): the rate past it too.
    const double steady_s = s.decode_s - s.graph_record_s;
    std::fprintf(stderr, "step graphs: %lld recorded in %.3f s (generation past it: %.1f t/s)\n",
                 static_cast<long long>(s.graphs_recorded), s.graph_record_s, steady_s > 0 ? gen / steady_s : 0.0);
  }
  if (config->spec != SpecMethod::None) {
    std::fprintf(stderr, "speculative (%s): %lld rounds, %lld drafted, %lld accepted (%.1f%%), mean acceptance length %.2f\n",
                 spec_method_name(config->spec), static_cast<long long>(s.spec_rounds),
                 static_cast<long long>(s.drafted), static_cast<long long>(s.accepted),
                 s.drafted ? 100.0 * s.accepted / s.drafted : 0.0, s.mean_acceptance_length());
    std::fprintf(stderr, "acceptance histogram (accepted drafts: rounds):");
    for (size_t i = 0; i < s.accept_histogram.size(); ++i)
      if (s.accept_histogram[i]) std::fprintf(stderr, " %zu:%lld", i, static_cast<long long>(s.accept_histogram[i]));
    std::fprintf(stderr, "\n");
    if (s.padded_rows > 0) std::fprintf(stderr, "verify rows padded: %lld\n", static_cast<long long>(s.padded_rows));
  }
  if (s.rounds > 0) {
    // Where a round's time goes: a greedy or look-ahead round's wait for its token is the device's share; the rest of
    // the round is host work during which the device idles (graph recording included).
    const double other_s = s.decode_s - s.draft_s - s.verify_s - s.commit_s;
    std::fprintf(stderr,
                 "time per phase: draft %.3f s, verify %.3f s (waiting for the device %.3f s), commit %.3f s, other %.3f s;"
                 " %lld rounds (%lld plain, %lld looked ahead), %.1f us a round outside the wait\n",
                 s.draft_s, s.verify_s, s.verify_wait_s, s.commit_s, other_s, static_cast<long long>(s.rounds),
                 static_cast<long long>(s.rounds - s.spec_rounds), static_cast<long long>(s.ahead_rounds),
                 1e6 * (s.decode_s - s.verify_wait_s - s.graph_record_s) / static_cast<double>(s.rounds));
  }
  return 0;
}

}  // namespace

void register_run(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  f->engine.add_to(*cmd);
  cmd->add_option("-p,--prompt", f->prompt, "Prompt text");
  cmd->add_option("--tokens", f->token_list, "Prompt as comma-separated token ids (instead of -p)");
  cmd->add_option("-n,--n-predict", f->n_predict, "Tokens to generate");
  cmd->add_flag("--chat", f->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_flag("--no-think", f->no_think, "With --chat: enable_thinking = false");
  cmd->add_flag("--ids", f->ids, "Print generated token ids (space-separated) instead of text");
  cmd->add_flag("--no-stats", f->quiet_stats, "Do not print statistics");
  cmd->add_flag("--no-adapt", f->no_spec_adapt, "Speculate every round with the full draft length");
  cmd->add_option("--temp", f->temp, "Temperature (0: greedy)");
  cmd->add_option("--top-k", f->top_k, "Top-k (0: off)");
  cmd->add_option("--top-p", f->top_p, "Top-p (1: off)");
  cmd->add_option("--min-p", f->min_p, "Min-p (0: off)");
  cmd->add_option("--repeat-penalty", f->repeat_penalty, "Repetition penalty (1: off)");
  cmd->add_option("--presence-penalty", f->presence_penalty, "Presence penalty");
  cmd->add_option("--frequency-penalty", f->frequency_penalty, "Frequency penalty");
  cmd->add_option("-s,--seed", f->seed, "RNG seed (-1: random)");
  cmd->callback([f, &exit_code] {
    if (f->prompt.empty() && f->token_list.empty()) {
      exit_code = fail(Status::error("give a prompt (-p TEXT or --tokens 1,2,3)"));
      return;
    }
    exit_code = run(*f);
  });
}

}  // namespace hyspec::cli
