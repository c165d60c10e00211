#include "common/random.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>

namespace mcrs {

bool random_bytes(void *out, size_t len) {
    char *p = static_cast<char *>(out);
    size_t got = 0;
    while (got < len) {
        ssize_t n = ::getrandom(p + got, len - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        got += static_cast<size_t>(n);
    }
    if (got == len) return true;
    int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    while (got < len) {
        ssize_t n = ::read(fd, p + got, len - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            break;
        }
        got += static_cast<size_t>(n);
    }
    ::close(fd);
    return got == len;
}

}  // namespace mcrs
