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
 * How bytes move: per connection, one thread per direction, each a blocking splice(2) from its
 * source into a pipe and from the pipe into its sink: the bytes never enter this process. Why
 * threads and not one poll loop (measured with bench/proxy.py, see relay notes in the report):
 * blocking calls keep the connect, the CONNECT handshake and the half-close plain sequential
 * code; a poll loop measured no faster and needs a state machine for all three. The cost is
 * two small threads per open connection: 64 KiB stacks of which a few pages are touched.
 * A pipe starts at the kernel's default size and grows to 1 MiB only once a splice fills it
 * (a bulk transfer), so idle and chatty connections do not take the sandbox user's pipe quota.
 */
#define _GNU_SOURCE
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKLOG 128                /* connections waiting: a burst of parallel downloads */
#define MAX_ANSWER 4096            /* the proxy's answer to a CONNECT: a status line, a few headers */
#define BULK_PIPE (1 << 20)        /* a pipe that filled grows to this (pipe-max-size's default) */
#define COPY_BUFFER (64 * 1024)    /* the read/write fallback's buffer, on the heap */
#define THREAD_STACK (64 * 1024)   /* splice loops need little stack; glibc's default is 8 MiB */
#define ACCEPT_PAUSE_NS 100000000L /* 100 ms: out of descriptors or threads, do not spin */

struct conn {
    int client, upstream;
    atomic_int flows; /* directions still running: the last one closes both sockets */
};

struct flow {
    struct conn *conn;
    int source, sink;
};

struct listener {
    const char *socket_path;
    int fd, localhost_port;
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

static bool write_all(int fd, const char *data, size_t length) {
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

/* read/write through a heap buffer, draining what the pipe already holds first: for a socket
   that cannot splice (EINVAL). */
static void copy(int source, int sink, int pipe_out, size_t pending) {
    char *buffer = malloc(COPY_BUFFER);
    if (buffer == NULL)
        return;
    for (;;) {
        int from = pending > 0 ? pipe_out : source;
        size_t want = pending > 0 && pending < COPY_BUFFER ? pending : COPY_BUFFER;
        ssize_t n = read(from, buffer, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || !write_all(sink, buffer, (size_t)n))
            break;
        if (from == pipe_out)
            pending -= (size_t)n;
    }
    free(buffer);
}

/* Move bytes from source to sink until the source ends or either fails. */
static void pump(int source, int sink) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) { /* out of descriptors or pipe quota */
        copy(source, sink, -1, 0);
        return;
    }
    long capacity = fcntl(pipe_fds[1], F_GETPIPE_SZ);
    bool grown = false;
    size_t pending = 0;
    for (;;) {
        ssize_t n = splice(source, NULL, pipe_fds[1], NULL, BULK_PIPE, SPLICE_F_MOVE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EINVAL) {
            copy(source, sink, pipe_fds[0], 0);
            break;
        }
        if (n <= 0)
            break;
        pending = (size_t)n;
        while (pending > 0) {
            ssize_t m = splice(pipe_fds[0], NULL, sink, NULL, pending, SPLICE_F_MOVE);
            if (m < 0 && errno == EINTR)
                continue;
            if (m < 0 && errno == EINVAL) {
                copy(source, sink, pipe_fds[0], pending);
                goto done;
            }
            if (m <= 0)
                goto done;
            pending -= (size_t)m;
        }
        /* A splice that filled half the pipe or more is a bulk transfer: a larger pipe moves
           more per call. Refused (over the user's pipe quota) is fine: the default works. */
        if (!grown && capacity > 0 && n >= capacity / 2) {
            grown = true;
            long now = fcntl(pipe_fds[1], F_SETPIPE_SZ, BULK_PIPE);
            if (now > 0)
                capacity = now;
        }
    }
done:
    close(pipe_fds[0]);
    close(pipe_fds[1]);
}

static void *run_flow(void *arg) {
    struct flow *flow = arg;
    struct conn *conn = flow->conn;
    pump(flow->source, flow->sink);
    /* Pass the end on (the peer sees EOF, the other direction goes on: a half-close), and stop
       reading the source, which wakes nothing but ends what is left of this direction. */
    shutdown(flow->sink, SHUT_WR);
    shutdown(flow->source, SHUT_RD);
    free(flow);
    if (atomic_fetch_sub(&conn->flows, 1) == 1) {
        close(conn->client);
        close(conn->upstream);
        free(conn);
    }
    return NULL;
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

/* Ask the proxy for this machine's `[localhost]` port; true on its 200. Bytes the proxy sent
   after its answer's head (a server that speaks first) go to the client, not lost. */
static bool connect_localhost(int upstream, int client, int port) {
    char head[MAX_ANSWER + 1];
    int length = snprintf(head, sizeof head, "CONNECT localhost:%d HTTP/1.1\r\n"
                                             "Host: localhost:%d\r\n\r\n", port, port);
    if (length < 0 || !write_all(upstream, head, (size_t)length))
        return false;
    size_t have = 0;
    char *end = NULL;
    while (end == NULL && have < MAX_ANSWER) {
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

/* One connection: dial the proxy, the handshake if any, then this thread carries the client's
   bytes upstream and a second thread the answer back. Any failure closes the client. */
static void *run_connection(void *arg) {
    struct accepted accepted = *(struct accepted *)arg;
    free(arg);
    int client = accepted.client, port = accepted.listener->localhost_port;
    int upstream = dial(accepted.listener->socket_path);
    struct conn *conn = NULL;
    struct flow *up = NULL, *down = NULL;
    if (upstream < 0 || (port != 0 && !connect_localhost(upstream, client, port)) ||
        (conn = malloc(sizeof *conn)) == NULL || (up = malloc(sizeof *up)) == NULL ||
        (down = malloc(sizeof *down)) == NULL) {
        free(conn);
        free(up);
        if (upstream >= 0)
            close(upstream);
        close(client);
        return NULL;
    }
    *conn = (struct conn){.client = client, .upstream = upstream};
    atomic_init(&conn->flows, 2);
    *up = (struct flow){conn, client, upstream};
    *down = (struct flow){conn, upstream, client};
    if (start_thread(run_flow, down) != 0) {
        /* No thread for the answer: end that direction now (the client sees EOF rather than
           wait for bytes that never come); this thread still carries the client's side. */
        shutdown(client, SHUT_WR);
        free(down);
        atomic_fetch_sub(&conn->flows, 1);
    }
    return run_flow(up);
}

/* Accept on every listener, forever; a thread per connection. */
static void serve(const struct listener *listeners, struct pollfd *polls, size_t count) {
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
   ends that connection with EPIPE, not the relay), and room for descriptors (six per
   connection: two sockets, two pipes). */
static void prepare_process(void) {
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
                size_t count) {
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
            served[i] = (struct listener){socket_path, listeners[i], localhost_ports[i]};
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
    if (argc != 4 || strcmp(argv[1], "--relay") != 0 || end == argv[3] || *end != '\0' ||
        port < 1 || port > 65535) {
        fputs("lnk-sandbox: usage: lnk-sandbox --relay SOCKET PORT\n", stderr);
        return 2;
    }
    int fd = relay_listen((int)port);
    if (fd < 0) {
        fprintf(stderr, "lnk-sandbox: cannot listen on 127.0.0.1:%ld: %s\n", port,
                strerror(errno));
        return 1;
    }
    prepare_process();
    struct listener listener = {argv[2], fd, 0};
    struct pollfd poll_fd;
    serve(&listener, &poll_fd, 1);
    return 1; /* not reached */
}
