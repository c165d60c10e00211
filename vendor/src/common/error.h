// Error codes of the engine and the exception type that carries them inside
// the C++ code. Nothing here crosses the C ABI: the API layer (capi/) turns
// an Error into a return code plus a thread-local message.
#pragma once

#include <stdexcept>
#include <string>

namespace mcrs {

// Negative ERR_* values, numerically identical to upstream's error.h.
enum ErrorCode : int {
    kErrNone = 0,
    kErrInvalidArgument = -1,
    kErrTooManyRequests = -2,
    kErrAddressNotRegistered = -3,
    kErrBatchBusy = -4,
    kErrDeviceNotFound = -6,
    kErrAddressOverlapped = -7,
    kErrDns = -101,
    kErrSocket = -102,
    kErrMalformedJson = -103,
    kErrRejectHandshake = -104,
    kErrMetadata = -200,
    kErrEndpoint = -201,
    kErrContext = -202,
    kErrNuma = -300,
    kErrClock = -301,
    kErrMemory = -302,
    kErrNotImplemented = -303,
    // Extension codes (not in upstream), kept in their own range.
    kErrTimeout = -1001,
    kErrShutdown = -1002,
    kErrBufferTooSmall = -1003,
    kErrInternal = -1004,
    kErrTransferFailed = -1005,  // a transfer ended FAILED (bindings report it)
};

// Positive Status::Code values returned by submit/status/free calls.
enum StatusCode : int {
    kStatusOk = 0,
    kStatusInvalidArgument = 1,
    kStatusTooManyRequests = 2,
    kStatusAddressNotRegistered = 3,
    kStatusBatchBusy = 4,
    kStatusDeviceNotFound = 6,
    kStatusAddressOverlapped = 7,
    kStatusNotSupportedTransport = 8,
    kStatusDns = 101,
    kStatusSocket = 102,
    kStatusMalformedJson = 103,
    kStatusRejectHandshake = 104,
    kStatusMetadata = 200,
    kStatusEndpoint = 201,
    kStatusContext = 202,
    kStatusNuma = 300,
    kStatusClock = 301,
    kStatusMemory = 302,
    kStatusNotImplemented = 999,
};

// The exception used for every expected failure inside the engine. `code`
// is always a negative ErrorCode.
class Error : public std::runtime_error {
public:
    Error(int code, const std::string &message)
        : std::runtime_error(message), code_(code) {}
    int code() const noexcept { return code_; }

private:
    int code_;
};

// A submit-style failure: carries a positive StatusCode.
class StatusError : public std::runtime_error {
public:
    StatusError(int status, const std::string &message)
        : std::runtime_error(message), status_(status) {}
    int status() const noexcept { return status_; }

private:
    int status_;
};

// Maps a negative error code to the matching positive status code.
int status_from_error(int err) noexcept;
// Maps a positive status code to the matching negative error code.
int error_from_status(int status) noexcept;
// Short symbolic name of an error or status code, e.g. "ERR_SOCKET".
const char *error_name(int code) noexcept;

// Thread-local record of the last failure of an API call on this thread.
void set_last_error(int code, const std::string &message) noexcept;
void clear_last_error() noexcept;
int last_error_code() noexcept;
const char *last_error_message() noexcept;

}  // namespace mcrs
