/* One direction of a relayed connection (relay_direction.c) and the loops that give a
 * direction or a connection a thread of its own (relay_own_thread.c). */
#ifndef LNK_RELAY_DIRECTION_H
#define LNK_RELAY_DIRECTION_H
#include <stdbool.h>
#include <stddef.h>

/* A direction that read this much from its source in reads of SMALL_READ or more (not short:
   its source had more) is a bulk transfer: the relaying thread hands it a thread of its own
   (relay.c). */
#define BULK_BYTES (8 << 20)
#define BULK_THREAD_NAME "lnk-relay-bulk" /* what /proc/PID/task/TID/comm says */

/* One direction of a connection. Copy mode (splice refused with EINVAL, or no pipe to be had)
   reads and writes through `buffer`, after the pipe has given back what it held. */
struct direction {
    int source, sink;
    int pipe[2];      /* -1, -1: none (copy mode from the start) */
    size_t in_pipe;   /* spliced in from the source, not yet out to the sink */
    long capacity;    /* the pipe's size */
    bool grown;       /* asked for BULK_PIPE once already */
    char *buffer;     /* copy mode only */
    size_t buffered, offset;
    size_t bulk_read; /* bytes of its reads that were not short, counted up to BULK_BYTES */
    bool ended;       /* the source is at EOF */
    bool drained;     /* the last read from the source took less than it could */
    bool done;        /* the sink is shut: nothing more moves this way */
    bool bulk;        /* moved BULK_BYTES: relay.c's relaying thread lets it go */
    bool promoted;    /* its own thread has it (relay.c: only the relaying thread reads or
                         writes this; while set, no other field is that thread's) */
};

/* Non-blocking sockets `source`, `sink`; a pipe, or copy mode without one; ended at once
   when neither can be had. */
void direction_open(struct direction *d, int source, int sink);
void direction_close(struct direction *d);
/* Move what can move without blocking, at most `budget` calls; return when a call would block,
   the direction is done, its source is drained, the budget is spent, or it turns bulk (`bulk`
   set: see BULK_BYTES). */
void direction_step(struct direction *d, int budget);
/* What the direction waits for: true for room in its sink, false for bytes from its source. */
bool direction_waits_for_sink(const struct direction *d);

/* Relay both ways in this thread with poll(2) until both are done (the fallback when the
   relaying thread cannot take a connection); the caller closes the sockets. */
void relay_both(int client, int upstream);
/* Move `d` in this thread with poll(2) until it is done: a promoted bulk direction. */
void relay_one_way(struct direction *d);
#endif
