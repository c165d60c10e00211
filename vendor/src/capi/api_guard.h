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

// For functions returning 0 / negative ERR_*.
template <class F>
int guard_errcode(const char *fn, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (const Error &e) {
        set_last_error(e.code(), std::string(fn) + ": " + e.what());
        MC_LOG(Debug, fn << " failed: " << e.what());
        return e.code();
    } catch (const StatusError &e) {
        int code = error_from_status(e.status());
        set_last_error(code, std::string(fn) + ": " + e.what());
        return code;
    } catch (const std::bad_alloc &) {
        set_last_error(kErrMemory, std::string(fn) + ": out of memory");
        return kErrMemory;
    } catch (const std::exception &e) {
        set_last_error(kErrInternal, std::string(fn) + ": internal error: " + e.what());
        return kErrInternal;
    } catch (...) {
        set_last_error(kErrInternal, std::string(fn) + ": unknown internal error");
        return kErrInternal;
    }
}

// For functions returning a positive Status::Code (submit/status/free).
template <class F>
int guard_status(const char *fn, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (const StatusError &e) {
        set_last_error(error_from_status(e.status()), std::string(fn) + ": " + e.what());
        MC_LOG(Debug, fn << " failed: " << e.what());
        return e.status();
    } catch (const Error &e) {
        set_last_error(e.code(), std::string(fn) + ": " + e.what());
        return status_from_error(e.code());
    } catch (const std::bad_alloc &) {
        set_last_error(kErrMemory, std::string(fn) + ": out of memory");
        return kStatusMemory;
    } catch (const std::exception &e) {
        set_last_error(kErrInternal, std::string(fn) + ": internal error: " + e.what());
        return kStatusInvalidArgument;
    } catch (...) {
        set_last_error(kErrInternal, std::string(fn) + ": unknown internal error");
        return kStatusInvalidArgument;
    }
}

// For functions returning a value; `fallback` on failure.
template <class T, class F>
T guard_value(const char *fn, T fallback, F &&body) noexcept {
    try {
        clear_last_error();
        return body();
    } catch (const Error &e) {
        set_last_error(e.code(), std::string(fn) + ": " + e.what());
        MC_LOG(Debug, fn << " failed: " << e.what());
    } catch (const StatusError &e) {
        set_last_error(error_from_status(e.status()), std::string(fn) + ": " + e.what());
    } catch (const std::bad_alloc &) {
        set_last_error(kErrMemory, std::string(fn) + ": out of memory");
    } catch (const std::exception &e) {
        set_last_error(kErrInternal, std::string(fn) + ": internal error: " + e.what());
    } catch (...) {
        set_last_error(kErrInternal, std::string(fn) + ": unknown internal error");
    }
    return fallback;
}

}  // namespace mcrs
