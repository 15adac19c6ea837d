// Typed errors thrown by every metrale entry point.
//
// Every validation failure names the argument, the value it had and what was
// expected, so a serving engine's log line is enough to find the bad call.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace metrale {

// Base of everything metrale throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument violates the contract of docs/spec.md section 6.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A well-formed request for a configuration that is not built (head_dim,
// block_size, GQA group); the message lists what is supported.
class Unsupported : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// The CUDA runtime reported an error (launch failure, no device, ...).
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Message text without iostreams: an ostream's numeric insertion goes
// through the global locale's facets, and a Python process that loaded
// another libstdc++ build (PyTorch's dependencies) was seen to crash there.
inline std::string to_text(const std::string& v) { return v; }
inline std::string to_text(const char* v) { return v ? v : "(null)"; }
inline std::string to_text(char v) { return std::string(1, v); }
inline std::string to_text(bool v) { return v ? "true" : "false"; }
inline std::string to_text(const void* v) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", v);
  return b;
}
template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string to_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", double(v));
    return b;
  } else {
    return std::to_string(v);
  }
}
template <class... T>
std::string concat(const T&... parts) {
  std::string s;
  ((s += to_text(parts)), ...);
  return s;
}

template <class T>
[[noreturn]] void throw_invalid(const char* arg, const T& value, const std::string& expected) {
  throw InvalidArgument(concat("metrale: invalid argument '", arg, "' = ", value, "; expected ", expected));
}
template <class T>
[[noreturn]] void throw_unsupported(const char* arg, const T& value, const std::string& supported) {
  throw Unsupported(concat("metrale: unsupported '", arg, "' = ", value, "; supported: ", supported));
}
// Whether f() runs without throwing Unsupported (a dispatch asked whether
// it has what a plan names).
template <class F>
bool runs_supported(F&& f) {
  try {
    f();
    return true;
  } catch (const Unsupported&) {
    return false;
  }
}
}  // namespace detail

// Throws InvalidArgument naming `arg` unless `ok`.
#define METRALE_CHECK_ARG(ok, arg, value, expected)                     \
  do {                                                                  \
    if (!(ok)) ::metrale::detail::throw_invalid((arg), (value), (expected)); \
  } while (0)

}  // namespace metrale
