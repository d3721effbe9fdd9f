/* The relay inside a sandbox: serves the sandbox's proxy listener (a unix socket the controller
 * bound in) on 127.0.0.1 of the sandbox's own network namespace, where HTTP_PROXY points; also
 * each `[localhost]` port (through the proxy, which checks the grant) and an agent's store
 * bridge.
 *
 * It only moves bytes: every decision is the proxy's, outside. It runs as the sandbox's user,
 * under the same Landlock and seccomp filter as the program (but before the unix-socket block,
 * which it is the one exception to), as a grandchild re-parented to bwrap's init, so it ends
 * with the sandbox. It reaches nothing but the one socket it was given.
 *
 * How bytes move: one thread per new connection (64 KiB stack) dials the proxy and does the
 * `[localhost]` handshake as plain blocking code, then hands the two sockets to the one relaying
 * thread and ends. The relaying thread waits on every connection's sockets with one epoll set
 * (level-triggered) and steps each direction (relay_direction.c: non-blocking splice(2) from its
 * source into a pipe and from the pipe into its sink: the bytes never enter this process). Why
 * one thread for the relaying and not a thread per connection polling its two sockets (what
 * this was until session 10): with 64 connections busy, each small request woke its own thread
 * twice (request, answer), a context switch each; one epoll_wait now returns the ready sockets
 * of many connections at once, and an idle connection costs no thread at all.
 *
 * A direction moves at most STEP_MOVES times per wake-up, so a bulk tunnel does not hold the
 * others' small requests back; once it has read BULK_BYTES in reads that were not short (its
 * source had more than a request or an answer of a few KiB) it is a bulk transfer and gets a
 * thread of its own (relay_own_thread.c), which moves it until it ends as fast as its sockets
 * let it and then hands the connection back; the relaying thread goes on with everything else,
 * the connection's other direction included (a thread per bulk direction, as many as the
 * sandbox's task limit allows: when none can be had, the direction stays here). Until it hands
 * it back, nothing of that direction is this thread's, and the connection's sockets stay open.
 * This does NOT tell a download from a long keep-alive connection whose answers of 16 KiB or
 * more add up to BULK_BYTES: that one gets a thread too, and is then relayed as every
 * connection was before session 10 (a wake-up of its thread per answer).
 *
 * Per small request (a keep-alive GET and its answer) the relay makes two splices each way: a
 * wake-up steps only the direction whose socket is ready (the other's splice would only say
 * EAGAIN), and a short read goes back to epoll instead of reading again for the EAGAIN: epoll
 * is level-triggered, so bytes that arrived meanwhile are reported at once. A socket's epoll
 * entry changes only when what its directions wait for does (a full sink, an end, a direction
 * promoted). The sandbox's side has TCP_NODELAY: an answer the proxy wrote in two pieces goes
 * out as two segments at once, not the second held by Nagle until the client's (delayed) ACK
 * of the first.
 *
 * When the relaying thread cannot be had (no epoll set or thread at the start, the hand-over
 * refused), a connection is relayed by its own thread with poll(2), as before.
 *
 * The proxy's own port hands its connections over instead (relay_start_handing, session 12):
 * the connection's thread dials the proxy's unix socket as above, sends HANDOFF_HEADER with
 * the accepted TCP socket (SCM_RIGHTS) in one message and closes both: the proxy serves the
 * sandbox's client socket itself (services/proxy/lnk_proxy/handoff.py says what it accepts),
 * and none of its bytes pass through here. Why: a 1 GiB tunnel was CPU-bound on two cores,
 * and the relay's splices were a whole extra hop of it (bench/README.md, sessions 11-12).
 * Where the kernel does not name a socket's namespace (SO_NETNS_COOKIE, which the proxy needs
 * to refuse a socket of its own), or the message cannot be sent, the bytes are relayed as
 * above. The `[localhost]` ports (their CONNECT handshake is this relay's) and the store
 * bridge (not the proxy) are always relayed.
 */
#define _GNU_SOURCE
#include "relay.h"
#include "relay_direction.h"
#include "write_all.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71 /* <asm-generic/socket.h>, Linux 5.14 */
#endif

#define BACKLOG 128                /* connections waiting: a burst of parallel downloads */
#define MAX_ANSWER 4096            /* the proxy's answer to a CONNECT: a status line, a few headers */
#define THREAD_STACK (64 * 1024)   /* splice loops need little stack; glibc's default is 8 MiB */
#define ACCEPT_PAUSE_NS 100000000L /* 100 ms: out of descriptors or threads, do not spin */
#define STEP_MOVES 16              /* splices (or reads, writes) of one direction per wake-up */
#define EVENTS 64                  /* ready sockets taken per epoll_wait */

struct listener {
    const char *socket_path;
    int fd, localhost_port, handshake_ms;
    bool hand_off; /* give each connection's socket to the proxy (see the top), not its bytes */
};

static void pause_accepting(void) {
    struct timespec pause = {0, ACCEPT_PAUSE_NS};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
}

static void close_keeping_errno(int fd) {
    int saved = errno;
    close(fd);
    errno = saved;
}

/* -- the relaying thread: every handed-over connection on one epoll set -- */

struct relayed;

/* One socket of a relayed connection: its epoll entry (`data.ptr` points here). */
struct side {
    struct relayed *owner;
    int fd;
    uint32_t registered; /* the events its entry asks for now */
    bool added;          /* in the epoll set (taken out while it waits for nothing: its
                            hang-up would otherwise be reported again and again) */
};

struct relayed {
    struct direction up, down;
    struct side client, upstream;
    bool ending;           /* the set refused an entry: over once no direction is promoted */
    bool closed;           /* ended in this batch of events: the rest of it skips it */
    struct relayed *later; /* the batch's ended connections, freed after it */
};

/* A promoted direction's thread hands its connection back through the same pipe as new ones,
   the pointer tagged in its low bits (calloc's alignment leaves them clear). */
#define BACK_UP ((uintptr_t)1)
#define BACK_DOWN ((uintptr_t)2)
#define BACK_TAGS (BACK_UP | BACK_DOWN)

static int relay_set = -1;      /* the epoll set; -1: each connection relays in its own thread */
static int handed[2] = {-1, -1}; /* connections handed over (or back): a pipe of pointers */

static int start_thread(void *(*run)(void *), void *arg);

/* The events `d` waits for on `fd` (none while its own thread has it). */
static uint32_t wanted(const struct direction *d, int fd) {
    if (d->promoted || d->done)
        return 0;
    if (direction_waits_for_sink(d))
        return d->sink == fd ? EPOLLOUT : 0;
    return d->source == fd ? EPOLLIN : 0;
}

static bool register_side(struct side *side, uint32_t events) {
    if (side->added && side->registered == events)
        return true; /* the usual case: a small request leaves every entry as it was */
    if (events == 0) {
        if (side->added)
            epoll_ctl(relay_set, EPOLL_CTL_DEL, side->fd, NULL);
        side->added = false;
        side->registered = 0;
        return true;
    }
    struct epoll_event event = {.events = events, .data.ptr = side};
    if (epoll_ctl(relay_set, side->added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, side->fd, &event) != 0)
        return false; /* out of memory or of the user's epoll watches: end this connection */
    side->added = true;
    side->registered = events;
    return true;
}

/* Each socket's entry as its two directions now wait; false when the set refused one. */
static bool rearm(struct relayed *r) {
    struct side *sides[2] = {&r->client, &r->upstream};
    for (int i = 0; i < 2; i++) {
        uint32_t events = wanted(&r->up, sides[i]->fd) | wanted(&r->down, sides[i]->fd);
        if (!register_side(sides[i], events))
            return false;
    }
    return true;
}

/* Write one pointer into the hand-over pipe, waiting for room if it is full. */
static void hand_back(uintptr_t tagged) {
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the direction's last state, before the pointer */
    for (;;) {
        ssize_t n = write(handed[1], &tagged, sizeof tagged);
        if (n == (ssize_t)sizeof tagged)
            return;
        struct pollfd room = {.fd = handed[1], .events = POLLOUT};
        if (n < 0 && errno == EAGAIN)
            poll(&room, 1, -1);
        else if (n < 0 && errno != EINTR)
            pause_accepting(); /* cannot happen while the relaying thread reads it */
    }
}

/* A promoted direction: moved in this thread until it is done, then handed back. */
static void *run_bulk(void *arg) {
    uintptr_t tagged = (uintptr_t)arg;
    struct relayed *r = (struct relayed *)(tagged & ~BACK_TAGS);
    prctl(PR_SET_NAME, BULK_THREAD_NAME, 0, 0, 0); /* before its first byte (the tests see it) */
    relay_one_way((tagged & BACK_UP) != 0 ? &r->up : &r->down);
    hand_back(tagged);
    return NULL;
}

/* A direction that turned bulk gets a thread of its own; it stays here if none can be had. */
static void promote(struct relayed *r, struct direction *d) {
    uintptr_t tag = d == &r->up ? BACK_UP : BACK_DOWN;
    d->promoted = true;
    if (start_thread(run_bulk, (void *)((uintptr_t)r | tag)) != 0)
        d->promoted = false;
}

/* Step `d` when the events on `fd` are what it waits for; promote it once it is bulk. */
static void step_on(struct relayed *r, struct direction *d, int fd, uint32_t got) {
    uint32_t waits = wanted(d, fd);
    if (waits == 0 || (got & (waits | EPOLLERR | EPOLLHUP)) == 0)
        return;
    direction_step(d, STEP_MOVES);
    if (d->bulk && !d->done)
        promote(r, d);
}

/* The connection is over: its sockets closed (which takes them out of the set). */
static void finish(struct relayed *r) {
    direction_close(&r->up);
    direction_close(&r->down);
    close(r->client.fd);
    close(r->upstream.fd);
    r->closed = true;
}

/* After `r`'s directions moved: its entries as they now wait, or its end (true: finished,
   the caller frees it). A promoted direction's thread uses the sockets until it hands the
   connection back, so nothing is closed before: a refused entry shuts both sockets instead,
   which ends that thread's direction too. */
static bool settle(struct relayed *r) {
    if (!r->ending && !rearm(r)) {
        r->ending = true;
        shutdown(r->client.fd, SHUT_RDWR);
        shutdown(r->upstream.fd, SHUT_RDWR);
    }
    if (r->up.promoted || r->down.promoted)
        return false;
    if (!r->ending && !(r->up.done && r->down.done))
        return false;
    finish(r);
    return true;
}

/* New connections from the pipe, and connections whose promoted direction is done. */
static void take_handed(struct relayed **ended) {
    uintptr_t batch[EVENTS];
    ssize_t n = read(handed[0], batch, sizeof batch);
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* a handed-back direction's state, as it left it */
    for (ssize_t i = 0; n > 0 && i < n / (ssize_t)sizeof batch[0]; i++) {
        struct relayed *r = (struct relayed *)(batch[i] & ~BACK_TAGS);
        if ((batch[i] & BACK_TAGS) != 0) {
            ((batch[i] & BACK_UP) != 0 ? &r->up : &r->down)->promoted = false;
        } else {
            /* bytes may be waiting already: level-triggered, epoll says so anyway */
            step_on(r, &r->up, r->client.fd, EPOLLIN);
            step_on(r, &r->down, r->upstream.fd, EPOLLIN);
        }
        if (settle(r)) {
            r->later = *ended; /* its sockets may have events later in this batch */
            *ended = r;
        }
    }
}

static void *run_relaying(void *unused) {
    (void)unused;
    struct epoll_event events[EVENTS];
    for (;;) {
        int n = epoll_wait(relay_set, events, EVENTS, -1);
        if (n < 0) {
            if (errno != EINTR)
                pause_accepting(); /* cannot happen with a valid set: do not spin */
            continue;
        }
        struct relayed *ended = NULL;
        for (int i = 0; i < n; i++) {
            struct side *side = events[i].data.ptr;
            if (side == NULL) {
                take_handed(&ended);
                continue;
            }
            struct relayed *r = side->owner;
            if (r->closed)
                continue;
            step_on(r, &r->up, side->fd, events[i].events);
            step_on(r, &r->down, side->fd, events[i].events);
            if (settle(r)) {
                r->later = ended;
                ended = r;
            }
        }
        while (ended != NULL) {
            struct relayed *next = ended->later;
            free(ended);
            ended = next;
        }
    }
    return NULL;
}

/* Give the connection to the relaying thread; false (nothing taken) when it cannot be. */
static bool hand_over(int client, int upstream) {
    if (relay_set < 0)
        return false;
    struct relayed *r = calloc(1, sizeof *r);
    if (r == NULL)
        return false;
    fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK);
    fcntl(upstream, F_SETFL, fcntl(upstream, F_GETFL) | O_NONBLOCK);
    direction_open(&r->up, client, upstream);
    direction_open(&r->down, upstream, client);
    r->client = (struct side){.owner = r, .fd = client};
    r->upstream = (struct side){.owner = r, .fd = upstream};
    ssize_t n;
    do /* a pointer's write is atomic (under PIPE_BUF): threads' hand-overs never mix */
        n = write(handed[1], &r, sizeof r);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof r)
        return true;
    direction_close(&r->up); /* the pipe is full or gone: this thread relays it */
    direction_close(&r->down);
    free(r);
    return false;
}

/* The epoll set, the hand-over pipe and the relaying thread; on any failure none of them, and
   connections relay in their own threads. */
static void start_relaying(void) {
    relay_set = epoll_create1(EPOLL_CLOEXEC);
    if (relay_set < 0)
        return;
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = NULL};
    if (pipe2(handed, O_CLOEXEC | O_NONBLOCK) == 0 &&
        epoll_ctl(relay_set, EPOLL_CTL_ADD, handed[0], &event) == 0 &&
        start_thread(run_relaying, NULL) == 0)
        return;
    close(relay_set);
    relay_set = -1;
    if (handed[0] >= 0) {
        close(handed[0]);
        close(handed[1]);
    }
}

static int start_thread(void *(*run)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_t thread;
    int rc = pthread_attr_init(&attr);
    if (rc != 0)
        return rc;
    rc = pthread_attr_setstacksize(&attr, THREAD_STACK);
    if (rc == 0)
        rc = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (rc == 0)
        rc = pthread_create(&thread, &attr, run, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

/* Milliseconds left until `deadline` (CLOCK_MONOTONIC), 0 when it has passed. */
static int left_ms(const struct timespec *deadline) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
                   (deadline->tv_nsec - now.tv_nsec) / 1000000;
    return ms <= 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Ask the proxy for this machine's `[localhost]` port; true on its 200 within handshake_ms.
   Bytes the proxy sent after its answer's head (a server that speaks first) go to the client,
   not lost. */
static bool connect_localhost(int upstream, int client, int port, int handshake_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += handshake_ms / 1000;
    deadline.tv_nsec += (long)(handshake_ms % 1000) * 1000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000;
    }
    char head[MAX_ANSWER + 1];
    int length = snprintf(head, sizeof head, "CONNECT localhost:%d HTTP/1.1\r\n"
                                             "Host: localhost:%d\r\n\r\n", port, port);
    if (length < 0 || !write_all(upstream, head, (size_t)length))
        return false;
    size_t have = 0;
    char *end = NULL;
    while (end == NULL && have < MAX_ANSWER) {
        struct pollfd answer = {.fd = upstream, .events = POLLIN, .revents = 0};
        int ready = poll(&answer, 1, left_ms(&deadline));
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            return false; /* no answer in time (or poll failed): the client is closed */
        ssize_t n = read(upstream, head + have, MAX_ANSWER - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        have += (size_t)n;
        head[have] = '\0';
        end = memmem(head, have, "\r\n\r\n", 4);
    }
    if (end == NULL)
        return false;
    bool ok = (strncmp(head, "HTTP/1.1 200", 12) == 0 || strncmp(head, "HTTP/1.0 200", 12) == 0)
              && (head[12] == ' ' || head[12] == '\r');
    size_t used = (size_t)(end + 4 - head);
    return ok && write_all(client, end + 4, have - used);
}

/* Whether the kernel names a socket's network namespace (SO_NETNS_COOKIE, Linux 5.14): the
   proxy refuses a handed socket whose namespace it cannot tell from its own, so without it the
   relay moves the bytes itself, as before. */
static bool namespaces_named(int fd) {
    uint64_t cookie = 0;
    socklen_t length = sizeof cookie;
    return getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &length) == 0;
}

/* Send `client` to the proxy on `upstream`: HANDOFF_HEADER and the one descriptor, in one
   message (the proxy's handoff.py refuses anything else). False when it did not go: nothing
   of it reached the proxy, and the connection can still relay bytes. */
static bool send_socket(int upstream, int client) {
    union {
        char space[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec header = {.iov_base = (void *)HANDOFF_HEADER, .iov_len = HANDOFF_HEADER_LEN};
    struct msghdr message = {.msg_iov = &header, .msg_iovlen = 1,
                             .msg_control = control.space, .msg_controllen = sizeof control.space};
    struct cmsghdr *rights = CMSG_FIRSTHDR(&message);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(rights), &client, sizeof client);
    ssize_t n;
    do
        n = sendmsg(upstream, &message, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)HANDOFF_HEADER_LEN;
}

/* A unix stream socket connected to path; -1 with errno. */
static int dial(const char *path) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t length = strlen(path);
    if (length >= sizeof address.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(address.sun_path, path, length);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    while (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        if (errno != EINTR) {
            close_keeping_errno(fd);
            return -1;
        }
    }
    return fd;
}

struct accepted {
    const struct listener *listener;
    int client;
};

/* One connection: dial the proxy, the handshake if any, then relay. Any failure closes the
   client (and only this connection). */
static void *run_connection(void *arg) {
    struct accepted accepted = *(struct accepted *)arg;
    free(arg);
    int client = accepted.client, port = accepted.listener->localhost_port;
    int upstream = dial(accepted.listener->socket_path);
    int handshake_ms = accepted.listener->handshake_ms;
    if (upstream >= 0 && accepted.listener->hand_off && send_socket(upstream, client)) {
        close(upstream); /* the proxy's now: this process keeps no copy of it */
        close(client);
        return NULL;
    }
    if (upstream >= 0 && (port == 0 || connect_localhost(upstream, client, port, handshake_ms))) {
        if (hand_over(client, upstream))
            return NULL; /* the relaying thread's now, closing included */
        relay_both(client, upstream);
    }
    if (upstream >= 0)
        close(upstream);
    close(client);
    return NULL;
}

/* Accept on every listener, forever; a thread per connection. */
static void serve(const struct listener *listeners, struct pollfd *polls, size_t count) {
    start_relaying();
    for (size_t i = 0; i < count; i++) {
        /* Non-blocking: a connection that poll saw may be gone by accept. */
        fcntl(listeners[i].fd, F_SETFL, fcntl(listeners[i].fd, F_GETFL) | O_NONBLOCK);
        polls[i] = (struct pollfd){.fd = listeners[i].fd, .events = POLLIN};
    }
    for (;;) {
        if (poll(polls, count, -1) < 0) {
            if (errno != EINTR)
                pause_accepting();
            continue;
        }
        for (size_t i = 0; i < count; i++) {
            if (polls[i].revents == 0)
                continue;
            int client = accept4(listeners[i].fd, NULL, NULL, SOCK_CLOEXEC);
            if (client < 0) {
                /* Out of descriptors or memory: the connection stays queued, the listener
                   readable, and accept would fail again at once: wait instead of spinning.
                   Other errors (none queued, a client that reset) concern one connection. */
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                    pause_accepting();
                continue;
            }
            /* Small answers out at once (see the top); refused, the relay still works. */
            int on = 1;
            setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
            struct accepted *accepted = malloc(sizeof *accepted);
            if (accepted != NULL)
                *accepted = (struct accepted){&listeners[i], client};
            if (accepted == NULL || start_thread(run_connection, accepted) != 0) {
                free(accepted); /* out of memory or threads: drop this one, then wait */
                close(client);
                pause_accepting();
            }
        }
    }
}

/* What the relay process needs besides its listeners: no SIGPIPE (a write to a closed peer
   ends that connection with EPIPE, not the relay), room for descriptors (six per
   connection: two sockets, two pipes), and not dumpable: the program runs as the same user,
   and a dumpable relay's descriptors (its connections to the proxy, sockets not yet handed
   over) could be taken with pidfd_getfd or /proc/PID/fd and kept, or used to send the proxy
   descriptors of the program's choosing. */
static void prepare_process(void) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
}

int relay_listen(int port) {
    if (port < 0 || port > 65535) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int on = 1;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || listen(fd, BACKLOG) != 0) {
        close_keeping_errno(fd);
        return -1;
    }
    return fd;
}

static bool is_listener(int fd, const int *listeners, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (listeners[i] == fd)
            return true;
    return false;
}

int relay_start(const char *socket_path, const int *listeners, const int *localhost_ports,
                size_t count, int handshake_ms) {
    return relay_start_handing(socket_path, listeners, localhost_ports, count, handshake_ms, false);
}

int relay_start_handing(const char *socket_path, const int *listeners,
                        const int *localhost_ports, size_t count, int handshake_ms,
                        bool hand_off) {
    if (count == 0) {
        errno = EINVAL;
        return -1;
    }
    struct listener *served = calloc(count, sizeof *served);
    struct pollfd *polls = calloc(count, sizeof *polls);
    pid_t child = served != NULL && polls != NULL ? fork() : -1;
    if (child == 0) {
        /* The child only forks the relay and exits, so that the relay is re-parented to
           bwrap's init (pid 1 of the sandbox) and ends with it; its status is the errno of a
           failed fork. */
        pid_t relay = fork();
        if (relay != 0)
            _exit(relay < 0 ? errno : 0);
        /* The relay: it keeps none of the target's stdio (a pipe whose reader waits for EOF
           must not stay open here) and nothing but its listeners. */
        for (int fd = 0; fd <= 2; fd++)
            if (!is_listener(fd, listeners, count))
                close(fd);
        prepare_process();
        for (size_t i = 0; i < count; i++)
            served[i] = (struct listener){socket_path, listeners[i], localhost_ports[i],
                                          handshake_ms,
                                          hand_off && localhost_ports[i] == 0 &&
                                              namespaces_named(listeners[i])};
        serve(served, polls, count);
        _exit(1); /* not reached */
    }
    int saved = errno, status = 0;
    if (child > 0) {
        while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        saved = WIFEXITED(status) ? WEXITSTATUS(status) : ECHILD;
    }
    for (size_t i = 0; i < count; i++)
        close(listeners[i]);
    free(served);
    free(polls);
    if (child > 0 && saved == 0)
        return 0;
    errno = saved != 0 ? saved : ENOMEM;
    return -1;
}

int relay_main(int argc, char **argv) {
    char *end = NULL;
    long port = argc == 4 ? strtol(argv[3], &end, 10) : 0;
    bool hand_off = argc >= 2 && strcmp(argv[1], "--relay-handoff") == 0;
    if (argc != 4 || (strcmp(argv[1], "--relay") != 0 && !hand_off) || end == argv[3] ||
        *end != '\0' || port < 1 || port > 65535) {
        fputs("lnk-sandbox: usage: lnk-sandbox --relay|--relay-handoff SOCKET PORT\n", stderr);
        return 2;
    }
    int fd = relay_listen((int)port);
    if (fd < 0) {
        fprintf(stderr, "lnk-sandbox: cannot listen on 127.0.0.1:%ld: %s\n", port,
                strerror(errno));
        return 1;
    }
    prepare_process();
    struct listener listener = {argv[2], fd, 0, RELAY_HANDSHAKE_MS,
                                hand_off && namespaces_named(fd)};
    struct pollfd poll_fd;
    serve(&listener, &poll_fd, 1);
    return 1; /* not reached */
}
