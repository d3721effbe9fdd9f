/* Relaying in a thread of its own, with poll(2): a whole connection when the relaying thread
 * cannot take it (relay.c's fallback), or one bulk direction the relaying thread let go.
 *
 * Why a bulk direction gets its own thread (bench/tunnel_ab.py, bench/README.md): on the one
 * epoll thread a direction moves at most a budget of splices per wake-up, so a bulk tunnel
 * does not hold other connections' small requests back; a 1 GiB tunnel then cost the relay
 * ~10 % more CPU than a thread per connection, which loops until its socket would block. A
 * direction that moved BULK_BYTES loops here the same way, while the relaying thread goes on
 * serving the rest (its other direction included).
 *
 * This file does NOT decide anything about the bytes, nor close the sockets: the caller does,
 * once every direction is done.
 */
#define _GNU_SOURCE
#include "relay_direction.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <time.h>

#define OUT_OF_MEMORY_PAUSE_NS 100000000L /* 100 ms */

/* What a direction waits for: room in its sink while it holds bytes, else its source. Its
   entry and the events that wake it are kept in `waits`, `wakes` for `ready`. */
static void want(const struct direction *d, struct pollfd *source, struct pollfd *sink,
                 struct pollfd **waits, short *wakes) {
    *waits = NULL;
    if (d->done)
        return;
    if (direction_waits_for_sink(d)) {
        sink->events |= POLLOUT;
        *waits = sink;
        *wakes = POLLOUT | POLLERR | POLLHUP;
    } else {
        source->events |= POLLIN;
        *waits = source;
        *wakes = POLLIN | POLLERR | POLLHUP;
    }
}

/* Whether poll woke what the direction waits for (a direction not waiting is done). */
static bool ready(const struct pollfd *waits, short wakes) {
    return waits != NULL && (waits->revents & (wakes | POLLNVAL)) != 0;
}

void relay_both(int client, int upstream) {
    struct direction up, down;
    fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK);
    fcntl(upstream, F_SETFL, fcntl(upstream, F_GETFL) | O_NONBLOCK);
    direction_open(&up, client, upstream);
    direction_open(&down, upstream, client);
    bool step_up = true, step_down = true;
    for (;;) {
        if (step_up)
            direction_step(&up, INT_MAX);
        if (step_down)
            direction_step(&down, INT_MAX);
        if (up.done && down.done)
            break;
        struct pollfd polls[2] = {{.fd = client}, {.fd = upstream}};
        struct pollfd *up_waits, *down_waits;
        short up_wakes = 0, down_wakes = 0;
        want(&up, &polls[0], &polls[1], &up_waits, &up_wakes);
        want(&down, &polls[1], &polls[0], &down_waits, &down_wakes);
        for (int i = 0; i < 2; i++)
            if (polls[i].events == 0)
                polls[i].fd = -1; /* its hang-up must not wake a loop that has nothing to do */
        if (poll(polls, 2, -1) < 0) {
            if (errno != EINTR)
                break; /* out of memory: end this connection */
            step_up = step_down = false;
            continue;
        }
        step_up = ready(up_waits, up_wakes);
        step_down = ready(down_waits, down_wakes);
    }
    direction_close(&up);
    direction_close(&down);
}

void relay_one_way(struct direction *d) {
    for (;;) {
        direction_step(d, INT_MAX);
        if (d->done)
            return;
        bool sink = direction_waits_for_sink(d);
        struct pollfd waited = {.fd = sink ? d->sink : d->source,
                                .events = sink ? POLLOUT : POLLIN};
        if (poll(&waited, 1, -1) < 0 && errno != EINTR) {
            /* Out of memory, the only error poll has here: wait a little, do not spin (the
               next step moves, says EAGAIN again, or ends the direction). */
            struct timespec pause = {0, OUT_OF_MEMORY_PAUSE_NS};
            nanosleep(&pause, NULL);
        }
    }
}
