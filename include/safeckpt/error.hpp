// safeckpt/error.hpp — the one error model of the library.
//
// Every call that reads untrusted bytes returns Result<T>: either a value or an
// Error. Nothing in the public API throws on bad input, and nothing aborts.
// ErrorCode numbers are pinned (like zstd's): tools and bindings may store them.
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace safeckpt {

// Closed set of error categories. Numbers are part of the ABI: never renumber.
enum class ErrorCode : std::uint8_t {
  kOk = 0,
  // The bytes are not a valid instance of the format (truncated record, bad
  // opcode, inconsistent header, view outside its storage, ...).
  kMalformed = 1,
  // A `Limits` cap was hit; the input may be valid but is larger than allowed.
  kLimitExceeded = 2,
  // Valid input that this library deliberately does not handle (TorchScript
  // archive, a dtype with no defined layout, encrypted zip, ...).
  kUnsupported = 3,
  // Policy: the pickle names a global that is not in the safe-globals
  // allowlist, or uses an opcode that imports or calls outside it.
  kDisallowedGlobal = 4,
  // Policy: an allowlisted callable used in a way the weights-only rules
  // refuse (SETITEM on a non-dict, BUILD on an unknown type, bad pid, ...).
  kDisallowedOperation = 5,
  // open/read/write/fsync/rename failed; message carries errno text.
  kIo = 6,
  // CUDA runtime error (only from safeckpt/cuda.hpp calls).
  kDevice = 7,
  // Caller passed an invalid argument (not an input-file problem).
  kInvalidArgument = 8,
  // A bug in safeckpt: an internal invariant did not hold. Fuzzers abort on it.
  kInternal = 9,
  // Output path exists and overwrite was not requested.
  kExists = 10,
  // The bytes do not match what was signed, or the signature/key/certificate
  // chain does not verify (safeckpt/sign.hpp; the loaders return it from
  // LoadOptions::verify_bytes before parsing).
  kIntegrity = 11,
};

// Stable lower-case identifier, e.g. "malformed", "disallowed_global".
std::string_view error_code_name(ErrorCode code) noexcept;

// True for the two policy codes: the file is well-formed but refused by the
// safe-globals rules. `safeckpt inspect` exits 1 for these, 2 for the rest.
constexpr bool is_policy_error(ErrorCode c) noexcept {
  return c == ErrorCode::kDisallowedGlobal || c == ErrorCode::kDisallowedOperation;
}

// Where in the input an error was found. Unknown fields stay empty / kNoOffset.
struct Location {
  static constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};
  std::string record;                // zip record ("archive/data.pkl") or stream name
  std::uint64_t offset = kNoOffset;  // byte offset inside `record` (or the file)
  std::string opcode;                // pickle opcode name, e.g. "REDUCE"
};

class Error {
 public:
  Error() = default;
  Error(ErrorCode code, std::string message, Location where = {})
      : code_(code), message_(std::move(message)), where_(std::move(where)) {}

  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  const Location& where() const noexcept { return where_; }
  Location& where() noexcept { return where_; }

  // Adds location facts that are still unknown (inner layers know offsets,
  // outer layers know the record name).
  Error& at_record(std::string_view record);
  Error& at_offset(std::uint64_t offset);
  Error& at_opcode(std::string_view opcode);

  // "<code>: <message> [record R, offset N, opcode OP]"
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kInternal;
  std::string message_;
  Location where_;
};

// Tag to construct a failed Result, mirroring std::unexpected.
struct Unexpected {
  Error error;
};
inline Unexpected make_error(ErrorCode code, std::string message, Location where = {}) {
  return Unexpected{Error(code, std::move(message), std::move(where))};
}
inline Unexpected unexpected(Error e) {
  return Unexpected{std::move(e)};
}

// A value or an Error, with std::expected's member names. [[nodiscard]] so a
// dropped error is a compile warning (-Werror in CI).
template <class T>
class [[nodiscard]] Result {
 public:
  using value_type = T;
  Result(const T& v) : v_(std::in_place_index<0>, v) {}
  Result(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}
  template <class U, std::enable_if_t<std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, Result> &&
                                          !std::is_same_v<std::decay_t<U>, Unexpected> &&
                                          !std::is_same_v<std::decay_t<U>, Error>,
                                      int> = 0>
  Result(U&& v) : v_(std::in_place_index<0>, T(std::forward<U>(v))) {}
  Result(Unexpected u) : v_(std::in_place_index<1>, std::move(u.error)) {}
  Result(Error e) : v_(std::in_place_index<1>, std::move(e)) {}

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  Error& error() & { return std::get<1>(v_); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Unexpected u) : err_(std::move(u.error)), ok_(false) {}
  Result(Error e) : err_(std::move(e)), ok_(false) {}
  bool has_value() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  void value() const {}
  Error& error() & { return err_; }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace safeckpt

// The one propagation macro. SAFECKPT_TRY(x, expr) declares `x` from a
// Result<T>; SAFECKPT_CHECK(expr) propagates a failed Result<void>/Result<T>.
#define SAFECKPT_CONCAT_INNER(a, b) a##b
#define SAFECKPT_CONCAT(a, b) SAFECKPT_CONCAT_INNER(a, b)
#define SAFECKPT_TRY_IMPL(tmp, var, expr)                                      \
  auto tmp = (expr);                                                           \
  if (!tmp.has_value()) return ::safeckpt::unexpected(std::move(tmp).error()); \
  var = std::move(tmp).value()
#define SAFECKPT_TRY(var, expr) SAFECKPT_TRY_IMPL(SAFECKPT_CONCAT(scr_try_, __COUNTER__), var, expr)
#define SAFECKPT_CHECK(expr)                                                               \
  do {                                                                                     \
    auto scr_chk_ = (expr);                                                                \
    if (!scr_chk_.has_value()) return ::safeckpt::unexpected(std::move(scr_chk_).error()); \
  } while (0)
