// Errors inside the library are C++ exceptions carrying a public status code and a message;
// api_guard() turns every exception into a status at the C ABI edge, so none ever crosses it.
#pragma once

#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "lnmlp.h"

namespace lnmlp {

class Error : public std::exception {
 public:
  Error(int32_t status, std::string message) : status_(status), message_(std::move(message)) {}
  int32_t status() const noexcept { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int32_t status_;
  std::string message_;
};

// Builds a message from any streamable pieces: fail(LNMLP_ERROR_INVALID_ARGUMENT, "hidden is ", h).
template <typename... Parts> [[noreturn]] void fail(int32_t status, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(status, os.str());
}

// Records "function: message" as this thread's last error. Never allocates or throws.
void set_last_error(const char* function, const char* message) noexcept;

// The calling thread's last error message (never NULL).
const char* last_error() noexcept;

// Runs fn() and returns LNMLP_SUCCESS, or the status of whatever it threw (with the message
// recorded for lnmlp_last_error). Nothing escapes.
template <typename Fn> int32_t api_guard(const char* function, Fn&& fn) noexcept {
  try {
    fn();
    return LNMLP_SUCCESS;
  } catch (const Error& e) {
    set_last_error(function, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(function, "out of host memory");
    return LNMLP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(function, e.what());
    return LNMLP_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(function, "internal error: unknown exception");
    return LNMLP_ERROR_INTERNAL;
  }
}

}  // namespace lnmlp
