// Errors are values: library code returns Status / Result<T>; only main() decides to exit.
#pragma once
#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace hyspec {

class Status {
 public:
  Status() = default;  // ok
  static Status ok() { return {}; }
  static Status error(std::string message) { return Status(std::move(message)); }
  template <typename... Args>
  static Status errorf(fmt::format_string<Args...> f, Args&&... args) {
    return Status(fmt::format(f, std::forward<Args>(args)...));
  }
  bool is_ok() const { return !message_; }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    static const std::string empty;
    return message_ ? *message_ : empty;
  }
  // Prefix context ("loading model.gguf: ") to an error; ok stays ok.
  Status with_context(const std::string& context) const {
    return is_ok() ? *this : Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string m) : message_(std::move(m)) {}
  std::optional<std::string> message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}                // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {}         // NOLINT: must be an error
  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  Status status() const { return is_ok() ? Status::ok() : std::get<1>(v_); }
  const std::string& message() const { return std::get<1>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace hyspec

// Propagate an error Status from an expression returning Status.
#define HS_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::hyspec::Status hs_st_ = (expr);     \
    if (!hs_st_.is_ok()) return hs_st_;   \
  } while (0)

#define HS_CONCAT_INNER(a, b) a##b
#define HS_CONCAT(a, b) HS_CONCAT_INNER(a, b)
// `HS_ASSIGN_OR_RETURN(auto x, expr)`: unwrap a Result or return its error.
#define HS_ASSIGN_OR_RETURN(lhs, expr)                          \
  auto HS_CONCAT(hs_res_, __LINE__) = (expr);                   \
  if (!HS_CONCAT(hs_res_, __LINE__).is_ok())                    \
    return HS_CONCAT(hs_res_, __LINE__).status();               \
  lhs = std::move(HS_CONCAT(hs_res_, __LINE__)).value()
