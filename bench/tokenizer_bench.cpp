// Tokenizer throughput on 1 MiB of English: the GPL-3 text that every Debian system ships
// (base-files), its paragraphs in a fixed pseudo-random order; and on random letter strings,
// which defeat the piece cache. Run: build/bench/bench_tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "text/tokenizer.h"

namespace {

constexpr const char* kEnglishSource = "/usr/share/common-licenses/GPL-3";
constexpr size_t kTextBytes = 1 << 20;

std::string fixtures_dir() {
  const char* env = std::getenv("HYSPEC_FIXTURES");
  return env && *env ? env : HYSPEC_DEFAULT_FIXTURES;
}

const hyspec::Tokenizer* tokenizer() {
  static std::unique_ptr<hyspec::Tokenizer> tok = []() -> std::unique_ptr<hyspec::Tokenizer> {
    auto gguf = hyspec::GgufFile::open(fixtures_dir() + "/tokenizer/ggml-vocab-qwen35.gguf");
    if (!gguf) return nullptr;
    auto t = hyspec::Tokenizer::from_gguf(**gguf);
    return t ? std::move(t).value() : nullptr;
  }();
  return tok.get();
}

// Paragraphs of the source, shuffled with a fixed seed and concatenated up to kTextBytes.
const std::string& english_text() {
  static const std::string text = [] {
    std::ifstream in(kEnglishSource, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string src = ss.str();
    std::vector<std::string> paragraphs;
    for (size_t pos = 0; pos < src.size();) {
      size_t end = src.find("\n\n", pos);
      end = end == std::string::npos ? src.size() : end + 2;
      paragraphs.push_back(src.substr(pos, end - pos));
      pos = end;
    }
    std::string out;
    if (paragraphs.empty()) return out;
    std::mt19937 rng(1234);
    while (out.size() < kTextBytes) {
      std::shuffle(paragraphs.begin(), paragraphs.end(), rng);
      for (const std::string& p : paragraphs) out += p;
    }
    out.resize(kTextBytes);
    return out;
  }();
  return text;
}

// Random lowercase "words" of 2..11 letters, a different 1 MiB text per iteration (kRandomTexts
// of them, more distinct pieces than the piece cache holds): nearly every piece goes through the
// merge loop. A lower bound for text in a language the vocabulary knows.
constexpr int kRandomTexts = 4;
const std::string& random_words_text(int index) {
  static const std::vector<std::string> texts = [] {
    std::mt19937 rng(99);
    std::vector<std::string> out(kRandomTexts);
    for (std::string& text : out) {
      while (text.size() < kTextBytes) {
        text += ' ';
        const int len = 2 + static_cast<int>(rng() % 10);
        for (int i = 0; i < len; ++i) text += static_cast<char>('a' + rng() % 26);
      }
      text.resize(kTextBytes);
    }
    return out;
  }();
  return texts[index % kRandomTexts];
}

bool ready(benchmark::State& state) {
  if (!tokenizer()) {
    state.SkipWithError("cannot load tokenizer/ggml-vocab-qwen35.gguf (set HYSPEC_FIXTURES)");
    return false;
  }
  if (english_text().empty()) {
    state.SkipWithError("cannot read /usr/share/common-licenses/GPL-3");
    return false;
  }
  return true;
}

void BM_EncodeEnglish(benchmark::State& state) {
  if (!ready(state)) return;
  const bool parse_special = state.range(0) != 0;
  const std::string& text = english_text();
  size_t n_tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tokenizer()->encode(text, parse_special);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}
BENCHMARK(BM_EncodeEnglish)->ArgName("parse_special")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_EncodeRandomWords(benchmark::State& state) {
  if (!ready(state)) return;
  random_words_text(0);  // generate outside the timed loop
  int index = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tokenizer()->encode(random_words_text(index++), false);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kTextBytes));
}
BENCHMARK(BM_EncodeRandomWords)->Unit(benchmark::kMillisecond);

void BM_DecodeEnglish(benchmark::State& state) {
  if (!ready(state)) return;
  const std::vector<int32_t> ids = tokenizer()->encode(english_text(), false);
  for (auto _ : state) {
    const std::string text = tokenizer()->decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
}
BENCHMARK(BM_DecodeEnglish)->Unit(benchmark::kMillisecond);

void BM_StreamDecodeEnglish(benchmark::State& state) {
  if (!ready(state)) return;
  const std::vector<int32_t> ids = tokenizer()->encode(english_text(), false);
  for (auto _ : state) {
    hyspec::TokenStreamDecoder stream(*tokenizer());
    size_t bytes = 0;
    for (int32_t id : ids) bytes += stream.push(id).size();
    bytes += stream.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
}
BENCHMARK(BM_StreamDecodeEnglish)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
