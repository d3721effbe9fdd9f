/* One direction of a relayed connection: non-blocking splice(2) from its source into a pipe
 * and from the pipe into its sink, so the bytes never enter this process; copy mode (read and
 * write through a buffer) where a socket cannot splice or no pipe can be had.
 *
 * A pipe starts at the kernel's default size and grows to 1 MiB once a splice fills half of it
 * (a bulk transfer: 4x fewer splices per GiB), so idle and chatty connections do not take the
 * sandbox user's pipe quota; when the quota refuses, the default size still works.
 *
 * A short read (under SMALL_READ and less than it could: the source drained) ends a step
 * instead of reading again for the EAGAIN (a larger one reads again: in a bulk transfer more
 * has often arrived, and going to epoll for it cost the tunnel ~10 %).
 *
 * This file does NOT decide anything about the bytes (every decision is the proxy's) nor wait
 * for readiness: the caller's epoll set or poll loop does (relay.c, relay_own_thread.c).
 */
#define _GNU_SOURCE
#include "relay_direction.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define BULK_PIPE (1 << 20)     /* a pipe that filled grows to this (pipe-max-size's default) */
#define COPY_BUFFER (64 * 1024) /* the read/write fallback's buffer, on the heap */
#define SMALL_READ (16 * 1024)  /* a shorter read drained its source (a request, an answer) */

/* The direction is over: pass the end on (the peer reads EOF while the other direction goes
   on: a half-close) and stop reading its source. An error ends it the same way; the peer's
   own error or EOF then ends the other direction. */
static void end_direction(struct direction *d) {
    shutdown(d->sink, SHUT_WR);
    shutdown(d->source, SHUT_RD);
    d->done = true;
}

static bool to_copy_mode(struct direction *d) {
    d->buffer = malloc(COPY_BUFFER);
    return d->buffer != NULL;
}

/* A splice that filled half the pipe or more is a bulk transfer: a larger pipe moves more per
   call. Refused (over the user's pipe quota) is fine: the default size works. */
static void grow_pipe(struct direction *d, ssize_t spliced) {
    if (d->grown || d->capacity <= 0 || spliced < d->capacity / 2)
        return;
    d->grown = true;
    long now = fcntl(d->pipe[1], F_SETPIPE_SZ, BULK_PIPE);
    if (now > 0)
        d->capacity = now;
}

/* A read from the source: counted toward BULK_BYTES unless it was short (a request, an
   answer: a keep-alive connection's small exchanges never add up to bulk, however many). */
static void count_read(struct direction *d, ssize_t n) {
    if (d->bulk || d->drained)
        return;
    d->bulk_read += (size_t)n;
    d->bulk = d->bulk_read >= BULK_BYTES;
}

/* Every call either moves bytes, ends the direction, or says EAGAIN. */
void direction_step(struct direction *d, int budget) {
    const unsigned flags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK;
    bool was_bulk = d->bulk;
    for (int moves = 0; !d->done; moves++) {
        if (moves == budget)
            return; /* still ready: the next wake-up goes on, after the others' turns */
        if (d->bulk && !was_bulk)
            return; /* just turned bulk: its caller moves it to a thread of its own */
        ssize_t n;
        bool from_source = false;
        if (d->buffered > 0) {
            n = write(d->sink, d->buffer + d->offset, d->buffered);
            if (n > 0) {
                d->offset += (size_t)n;
                d->buffered -= (size_t)n;
                continue;
            }
        } else if (d->in_pipe > 0 && d->buffer == NULL) {
            n = splice(d->pipe[0], NULL, d->sink, NULL, d->in_pipe, flags);
            if (n > 0) {
                d->in_pipe -= (size_t)n;
                continue;
            }
            if (n < 0 && errno == EINVAL && to_copy_mode(d))
                continue;
        } else if (d->in_pipe > 0) { /* copy mode: what the pipe still holds, first */
            n = read(d->pipe[0], d->buffer, d->in_pipe < COPY_BUFFER ? d->in_pipe : COPY_BUFFER);
            if (n > 0) {
                d->in_pipe -= (size_t)n;
                d->buffered = (size_t)n;
                d->offset = 0;
                continue;
            }
        } else if (d->ended) {
            end_direction(d);
            return;
        } else if (d->drained) {
            d->drained = false; /* the next readiness reads again */
            return;
        } else if (d->buffer == NULL) {
            from_source = true;
            n = splice(d->source, NULL, d->pipe[1], NULL, BULK_PIPE, flags);
            if (n > 0) {
                d->in_pipe = (size_t)n;
                d->drained = n < d->capacity && n < SMALL_READ;
                count_read(d, n);
                grow_pipe(d, n);
                continue;
            }
            if (n < 0 && errno == EINVAL && to_copy_mode(d))
                continue;
        } else {
            from_source = true;
            n = read(d->source, d->buffer, COPY_BUFFER);
            if (n > 0) {
                d->buffered = (size_t)n;
                d->offset = 0;
                d->drained = n < COPY_BUFFER && n < SMALL_READ;
                count_read(d, n);
                continue;
            }
        }
        if (n == 0 && from_source) {
            d->ended = true;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        end_direction(d);
        return;
    }
}

bool direction_waits_for_sink(const struct direction *d) {
    return d->in_pipe > 0 || d->buffered > 0;
}

void direction_open(struct direction *d, int source, int sink) {
    *d = (struct direction){.source = source, .sink = sink, .pipe = {-1, -1}};
    if (pipe2(d->pipe, O_CLOEXEC) == 0)
        d->capacity = fcntl(d->pipe[1], F_GETPIPE_SZ);
    else if (!to_copy_mode(d)) /* out of descriptors or pipe quota: copy mode */
        end_direction(d);      /* and out of memory: this direction cannot run */
}

void direction_close(struct direction *d) {
    if (d->pipe[0] >= 0) {
        close(d->pipe[0]);
        close(d->pipe[1]);
    }
    free(d->buffer);
}
