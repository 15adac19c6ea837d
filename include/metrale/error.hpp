// Typed errors thrown by every metrale entry point.
//
// Every validation failure names the argument, the value it had and what was
// expected, so a serving engine's log line is enough to find the bad call.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace metrale {

// Base of everything metrale throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument violates the contract of docs/../SYSTEM.md section 6.
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
template <class T>
[[noreturn]] void throw_invalid(const char* arg, const T& value, const std::string& expected) {
  std::ostringstream os;
  os << "metrale: invalid argument '" << arg << "' = " << value << "; expected " << expected;
  throw InvalidArgument(os.str());
}
template <class T>
[[noreturn]] void throw_unsupported(const char* arg, const T& value, const std::string& supported) {
  std::ostringstream os;
  os << "metrale: unsupported '" << arg << "' = " << value << "; supported: " << supported;
  throw Unsupported(os.str());
}
}  // namespace detail

// Throws InvalidArgument naming `arg` unless `ok`.
#define METRALE_CHECK_ARG(ok, arg, value, expected)                     \
  do {                                                                  \
    if (!(ok)) ::metrale::detail::throw_invalid((arg), (value), (expected)); \
  } while (0)

}  // namespace metrale
