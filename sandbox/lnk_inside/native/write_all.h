/* Writing a whole buffer to a descriptor (write_all.c): the relay's handshake and the
 * connector's CONNECT and first tunnelled bytes, both run inside a sandbox. */
#ifndef LNK_WRITE_ALL_H
#define LNK_WRITE_ALL_H
#include <stdbool.h>
#include <stddef.h>
/* Write all `length` bytes of `data` to `fd`, again after EINTR and after a short write: true
   once all are written; false on an error (errno says which) or a write of nothing. */
bool write_all(int fd, const char *data, size_t length);
#endif
