#include "common/error.h"

namespace mcrs {

int status_from_error(int err) noexcept {
    switch (err) {
        case kErrNone: return kStatusOk;
        case kErrNotImplemented: return kStatusNotImplemented;
        case kErrTimeout:
        case kErrShutdown:
        case kErrBufferTooSmall:
        case kErrInternal:
        case kErrTransferFailed: return kStatusInvalidArgument;
        default: return err < 0 ? -err : err;
    }
}

int error_from_status(int status) noexcept {
    switch (status) {
        case kStatusOk: return kErrNone;
        case kStatusNotImplemented: return kErrNotImplemented;
        case kStatusNotSupportedTransport: return kErrNotImplemented;
        default: return status > 0 ? -status : status;
    }
}

const char *error_name(int code) noexcept {
    switch (code) {
        case kErrNone: return "OK";
        case kErrInvalidArgument: return "ERR_INVALID_ARGUMENT";
        case kErrTooManyRequests: return "ERR_TOO_MANY_REQUESTS";
        case kErrAddressNotRegistered: return "ERR_ADDRESS_NOT_REGISTERED";
        case kErrBatchBusy: return "ERR_BATCH_BUSY";
        case kErrDeviceNotFound: return "ERR_DEVICE_NOT_FOUND";
        case kErrAddressOverlapped: return "ERR_ADDRESS_OVERLAPPED";
        case kErrDns: return "ERR_DNS";
        case kErrSocket: return "ERR_SOCKET";
        case kErrMalformedJson: return "ERR_MALFORMED_JSON";
        case kErrRejectHandshake: return "ERR_REJECT_HANDSHAKE";
        case kErrMetadata: return "ERR_METADATA";
        case kErrEndpoint: return "ERR_ENDPOINT";
        case kErrContext: return "ERR_CONTEXT";
        case kErrNuma: return "ERR_NUMA";
        case kErrClock: return "ERR_CLOCK";
        case kErrMemory: return "ERR_MEMORY";
        case kErrNotImplemented: return "ERR_NOT_IMPLEMENTED";
        case kErrTimeout: return "MC_ERR_TIMEOUT";
        case kErrShutdown: return "MC_ERR_SHUTDOWN";
        case kErrBufferTooSmall: return "MC_ERR_BUFFER_TOO_SMALL";
        case kErrInternal: return "MC_ERR_INTERNAL";
        case kErrTransferFailed: return "MC_ERR_TRANSFER_FAILED";
        case kStatusInvalidArgument: return "STATUS_INVALID_ARGUMENT";
        case kStatusTooManyRequests: return "STATUS_TOO_MANY_REQUESTS";
        case kStatusAddressNotRegistered: return "STATUS_ADDRESS_NOT_REGISTERED";
        case kStatusBatchBusy: return "STATUS_BATCH_BUSY";
        case kStatusNotSupportedTransport: return "STATUS_NOT_SUPPORTED_TRANSPORT";
        case kStatusNotImplemented: return "STATUS_NOT_IMPLEMENTED";
        default: return "UNKNOWN";
    }
}

namespace {
struct LastError {
    int code = 0;
    std::string message;
};
thread_local LastError t_last_error;
}  // namespace

void set_last_error(int code, const std::string &message) noexcept {
    try {
        t_last_error.code = code;
        t_last_error.message = message;
    } catch (...) {
        t_last_error.code = code;
        t_last_error.message.clear();
    }
}

void clear_last_error() noexcept {
    t_last_error.code = 0;
    t_last_error.message.clear();
}

int last_error_code() noexcept { return t_last_error.code; }

const char *last_error_message() noexcept { return t_last_error.message.c_str(); }

}  // namespace mcrs
