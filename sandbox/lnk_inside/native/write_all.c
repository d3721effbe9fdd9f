/* write_all (write_all.h), linked into the confiner (for its relay) and the connector. */
#include "write_all.h"

#include <errno.h>
#include <unistd.h>

bool write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        data += n;
        length -= (size_t)n;
    }
    return true;
}
