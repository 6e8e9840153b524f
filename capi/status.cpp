#include "capi/status.h"

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "driver/error.h"

namespace tide::capi {
namespace {

thread_local std::string last_error;
thread_local std::uint64_t abi_calls = 0;

}  // namespace

void count_call() noexcept { ++abi_calls; }

std::uint64_t calls() noexcept { return abi_calls; }

void set_last_error(std::string message) { last_error = std::move(message); }

void clear_last_error() { last_error.clear(); }

const char* last_error_text() { return last_error.c_str(); }

tide_status status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const driver::DriverNotFound& e) {
    set_last_error(e.what());
    return TIDE_ERROR_NO_DRIVER;
  } catch (const driver::CudaError& e) {
    set_last_error(e.what());
    return e.result() == CUDA_ERROR_OUT_OF_MEMORY ? TIDE_ERROR_OUT_OF_MEMORY : TIDE_ERROR_CUDA;
  } catch (const std::invalid_argument& e) {  // config::EnvError among them
    set_last_error(e.what());
    return TIDE_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc& e) {
    // tide's own bad_allocs (a pinned memory cap) say what ran out; the standard one says nothing.
    const std::string_view what = e.what();
    set_last_error(what.starts_with("tide:") ? std::string(what) : "tide: out of host memory");
    return TIDE_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return TIDE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("tide: unknown internal error");
    return TIDE_ERROR_INTERNAL;
  }
}

}  // namespace tide::capi

extern "C" TIDE_API uint64_t tide_abi_calls(void) { return tide::capi::calls(); }
