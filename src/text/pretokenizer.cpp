#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "text/utf8.h"

namespace hyspec {

// Unicode White_Space, written for use inside a character class.
#define HS_WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
const char* const Pretokenizer::kQwen35Pattern =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
    "|\\p{N}"
    "| ?[^" HS_WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|[" HS_WS "]*[\\r\\n]+"
    "|[" HS_WS "]+(?![^" HS_WS "])"
    "|[" HS_WS "]+";
#undef HS_WS

struct Pretokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state. Match data with one ovector pair and the JIT stack do not depend on the
// pattern, so one set serves every Pretokenizer on the thread.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  // The default 32 KiB JIT stack can run out on long runs of white space; grow up to 8 MiB.
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  bool usable() const { return data && context; }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Pretokenizer::Pretokenizer(std::unique_ptr<Regex> re) : re_(std::move(re)) {}
Pretokenizer::~Pretokenizer() = default;

Result<std::unique_ptr<Pretokenizer>> Pretokenizer::create(std::string_view pattern) {
  auto re = std::make_unique<Regex>();
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!re->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return Status::errorf("pre-tokenizer regex: {} at offset {}", reinterpret_cast<const char*>(msg), err_offset);
  }
  // Without JIT (unsupported platform) the interpreter gives the same matches, only slower.
  re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Pretokenizer>(new Pretokenizer(std::move(re)));
}

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  MatchScratch& scratch = match_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = PCRE2_ERROR_NOMEMORY;
    if (scratch.usable()) {
      rc = re_->jit ? pcre2_jit_match(re_->code, subject, text.size(), pos, 0, scratch.data, scratch.context)
                    : pcre2_match(re_->code, subject, text.size(), pos, 0, scratch.data, scratch.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {  // only bytes that are not valid UTF-8 remain
      pieces.push_back(text.substr(pos));
      break;
    }
    size_t begin, end;
    if (rc < 0) {
      // A resource limit (never seen with the 8 MiB JIT stack): cut one character off and go on,
      // so encoding degrades instead of failing.
      int32_t cp;
      begin = pos;
      end = pos + utf8_decode(text, pos, cp);
    } else {
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
      begin = ov[0];
      end = ov[1];
      if (end <= begin) {  // the pattern has no empty alternative; guard against looping anyway
        if (begin >= text.size()) break;
        int32_t cp;
        end = begin + utf8_decode(text, begin, cp);
      }
    }
    if (begin > pos) pieces.push_back(text.substr(pos, begin - pos));  // skipped invalid bytes
    pieces.push_back(text.substr(begin, end - begin));
    pos = end;
  }
}

}  // namespace hyspec
