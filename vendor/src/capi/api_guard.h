// The exception and error barrier of the C ABI. Every extern "C" function
// runs its body through one of these guards: exceptions become return codes
// and a thread-local message, so nothing ever unwinds into C or Rust.
#pragma once

#include <new>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "engine/transfer_engine.h"

namespace mcrs {

inline TransferEngine *engine_of(void *handle, const char *fn) {
    if (!handle) throw Error(kErrInvalidArgument, std::string(fn) + ": engine handle is null");
    return static_cast<TransferEngine *>(handle);
}

// The exception in flight, as both C conventions see it.
struct Failure {
    int err;     // 0 / negative ERR_* convention
    int status;  // positive Status::Code convention (submit/status/free)
};

// Call only inside a catch block: names the exception being handled,
// records the thread-local message (prefixed with the C function's name)
// and returns its code in both conventions. The one place that maps C++
// exceptions to C error codes.
inline Failure record_failure(const char *fn) noexcept {
    try {
        throw;
    } catch (const StatusError &e) {
        int err = error_from_status(e.status());
        set_last_error(err, std::string(fn) + ": " + e.what());
        MC_LOG(Debug, fn << " failed: " << e.what());
        return {err, e.status()};
    } catch (const Error &e) {
        set_last_error(e.code(), std::string(fn) + ": " + e.what());
        MC_LOG(Debug, fn << " failed: " << e.what());
        return {e.code(), status_from_error(e.code())};
    } catch (const std::bad_alloc &) {
        set_last_error(kErrMemory, std::string(fn) + ": out of memory");
        return {kErrMemory, kStatusMemory};
    } catch (const std::exception &e) {
        set_last_error(kErrInternal, std::string(fn) + ": internal error: " + e.what());
        return {kErrInternal, kStatusInvalidArgument};
    } catch (...) {
        set_last_error(kErrInternal, std::string(fn) + ": unknown internal error");
        return {kErrInternal, kStatusInvalidArgument};
    }
}

// For functions returning 0 / negative ERR_*.
template <class F>
int guard_errcode(const char *fn, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (...) {
        return record_failure(fn).err;
    }
}

// For functions returning a positive Status::Code (submit/status/free).
template <class F>
int guard_status(const char *fn, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (...) {
        return record_failure(fn).status;
    }
}

// For functions returning a value; `fallback` on failure.
template <class T, class F>
T guard_value(const char *fn, T fallback, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (...) {
        record_failure(fn);
        return fallback;
    }
}

}  // namespace mcrs
