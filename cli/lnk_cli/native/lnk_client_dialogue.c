/* The launch dialogue of the `lnk` client (lnk_client.h), after its request: the frames on the
 * launch socket, the signals held then forwarded, and each answer of the controller ended as
 * cli/lnk_cli/launch_dialogue.py's dialogue ends it (same message, same exit code).
 *
 * Frames: a 4-byte big-endian length, then one JSON object; descriptors ride with SCM_RIGHTS on
 * the first byte; at most MAX_FRAME bytes and MAX_FDS descriptors either way. A frame past
 * those, or one that is not the strict JSON lnk_client_json.c reads, ends the client with one
 * line, never a crash or a hang: the controller is trusted, its bugs are not.
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const int FORWARDED[] = {LNK_FORWARDED_SIGNALS};
#define FORWARDED_COUNT (sizeof FORWARDED / sizeof FORWARDED[0])

/* The connection failed: `error` is an errno, or 0 for the controller's EOF. Python's quick
   path turns EOFError and ConnectionError into this StateError; any other OSError would be a
   traceback there. */
__attribute__((noreturn)) static void lost(int error) {
    struct text m = message_start();
    bool connection = error == EPIPE || error == ESHUTDOWN || error == ECONNRESET ||
                      error == ECONNREFUSED || error == ECONNABORTED;
    if (error == 0 || connection) {
        text_str(&m, "the controller ended the launch without an answer (");
        if (error == 0)
            text_str(&m, "the peer closed the connection");
        else
            text_format(&m, "[Errno %d] %s", error, strerror(error));
        text_str(&m, "); see its log");
    } else {
        text_format(&m, "cannot talk to the controller: %s", strerror(error));
    }
    message_exit(&m, EXIT_RUN_ERROR);
}

/* The controller sent what no frame may be: a clean error, never a crash or a hang. */
__attribute__((noreturn)) static void bad_frame(const char *why) {
    struct text m = message_start();
    text_str(&m, "the controller sent a bad frame (");
    text_str(&m, why);
    text_str(&m, "); see its log");
    message_exit(&m, EXIT_RUN_ERROR);
}

/* Python's str(value): a string as it is, anything else as its repr. */
static void text_str_of(struct text *t, const struct json_value *value) {
    if (value != NULL && value->kind == JSON_STRING)
        text_bytes(t, value->text, value->length);
    else
        text_repr(t, value);
}

/* Python's bool(value). */
static bool truthy(const struct json_value *value) {
    if (value == NULL)
        return false;
    switch (value->kind) {
    case JSON_NULL:
    case JSON_FALSE:
        return false;
    case JSON_TRUE:
        return true;
    case JSON_INT:
        return value->integer != 0;
    case JSON_STRING:
        return value->length > 0;
    default:
        return value->count > 0;
    }
}

/* --- frames ------------------------------------------------------------------------------ */

/* Send the frame in `t` (frame_begin's room, then its JSON) with `fds` on its first byte:
   0, or an errno. A frame over MAX_FRAME ends the client (Python's ValueError). */
static int send_frame(int sock, struct text *t, const int *fds, size_t count) {
    size_t length = t->length - HEADER_BYTES;
    if (length > MAX_FRAME) {
        struct text m = message_start();
        text_format(&m, "frame of %zu bytes is over the limit of %d", length, MAX_FRAME);
        message_exit(&m, EXIT_RUN_ERROR);
    }
    if (count > MAX_FDS) {
        struct text m = message_start();
        text_format(&m, "%zu descriptors is over the limit of %d", count, MAX_FDS);
        message_exit(&m, EXIT_RUN_ERROR);
    }
    for (int i = 0; i < HEADER_BYTES; i++)
        t->data[i] = (char)((length >> (8 * (HEADER_BYTES - 1 - i))) & 0xFF);
    size_t sent = 0;
    if (count > 0) {
        union {
            struct cmsghdr align;
            char buffer[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        } control;
        memset(&control, 0, sizeof control);
        struct iovec first = {.iov_base = t->data, .iov_len = 1};
        struct msghdr message = {.msg_iov = &first,
                                 .msg_iovlen = 1,
                                 .msg_control = control.buffer,
                                 .msg_controllen = CMSG_SPACE(sizeof(int) * count)};
        struct cmsghdr *rights = CMSG_FIRSTHDR(&message);
        rights->cmsg_level = SOL_SOCKET;
        rights->cmsg_type = SCM_RIGHTS;
        rights->cmsg_len = CMSG_LEN(sizeof(int) * count);
        memcpy(CMSG_DATA(rights), fds, sizeof(int) * count);
        ssize_t n;
        while ((n = sendmsg(sock, &message, MSG_NOSIGNAL)) < 0)
            if (errno != EINTR)
                return errno;
        sent = (size_t)n;
    }
    while (sent < t->length) {
        ssize_t n = send(sock, t->data + sent, t->length - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        sent += (size_t)n;
    }
    return 0;
}

void frame_send(int sock, struct text *t, const int *fds, size_t count) {
    int error = send_frame(sock, t, fds, count);
    if (error != 0)
        lost(error);
}

static void read_exactly(int sock, unsigned char *data, size_t length) {
    while (length > 0) {
        ssize_t n = recv(sock, data, length, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            lost(n == 0 ? 0 : errno);
        data += n;
        length -= (size_t)n;
    }
}

/* Close every descriptor an SCM_RIGHTS message brought: nothing here keeps one (the Python
   client keeps only a terminal's pty master, and this path has no terminal). */
static void close_passed(struct msghdr *message) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(message); c != NULL; c = CMSG_NXTHDR(message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            close(fd);
        }
    }
}

/* One frame from the controller into `out` (free it with json_free); any descriptors that came
   with it are closed. A bad frame or a lost connection ends the client. */
static void receive_frame(int sock, struct json_value *out) {
    unsigned char header[HEADER_BYTES];
    union {
        struct cmsghdr align;
        char buffer[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = header, .iov_len = sizeof header};
    struct msghdr message = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buffer,
        .msg_controllen = sizeof control.buffer};
    ssize_t n;
    while ((n = recvmsg(sock, &message, MSG_CMSG_CLOEXEC)) < 0)
        if (errno != EINTR)
            lost(errno);
    close_passed(&message);
    if (message.msg_flags & MSG_CTRUNC)
        bad_frame("too many descriptors in one frame");
    if (n == 0)
        lost(0);
    read_exactly(sock, header + n, sizeof header - (size_t)n);
    uint32_t length = 0;
    for (size_t i = 0; i < sizeof header; i++)
        length = length << 8 | header[i];
    if (length > MAX_FRAME) {
        struct text why = {0};
        text_format(&why, "frame of %u bytes is over the limit of %d", (unsigned)length, MAX_FRAME);
        bad_frame(why.data);
    }
    unsigned char *body = malloc((size_t)length + 1);
    if (body == NULL)
        fail(EXIT_RUN_ERROR, "out of memory");
    read_exactly(sock, body, length);
    const char *why = NULL;
    if (json_parse((const char *)body, length, out, &why) != 0)
        bad_frame(why);
    free(body);
}

void frame_begin(struct text *t) { text_bytes(t, "\0\0\0\0", HEADER_BYTES); }

/* --- signals ----------------------------------------------------------------------------- */

static int signal_pipe = -1; /* the forwarding handler's write end; set before it is installed */

/* The handler only notes the signal: the frame is sent from the main loop. */
static void note_signal(int number) {
    int saved = errno;
    unsigned char byte = (unsigned char)number;
    ssize_t ignored = write(signal_pipe, &byte, 1); /* full pipe: the signal is dropped */
    (void)ignored;
    errno = saved;
}

/* Python's KeyboardInterrupt before the signals are held: `lnk: interrupted`, exit 125. */
static void interrupted(int number) {
    (void)number;
    static const char message[] = "lnk: interrupted\n";
    ssize_t ignored = write(2, message, sizeof message - 1);
    (void)ignored;
    _exit(EXIT_RUN_ERROR);
}

static void set_handler(int number, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART; /* a frame being read goes on after a forwarded signal */
    if (sigemptyset(&action.sa_mask) != 0 || sigaction(number, &action, NULL) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot set a signal handler: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
    }
}

/* launch_dialogue's held_signals (SIG_BLOCK) and released_signals (SIG_UNBLOCK). */
static void mask_forwarded(int how) {
    sigset_t set;
    if (sigemptyset(&set) != 0)
        fail(EXIT_RUN_ERROR, "cannot hold the signals");
    for (size_t i = 0; i < FORWARDED_COUNT; i++)
        if (sigaddset(&set, FORWARDED[i]) != 0)
            fail(EXIT_RUN_ERROR, "cannot hold the signals");
    if (sigprocmask(how, &set, NULL) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot hold the signals: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
    }
}

static void forward(int sock, int number) {
    struct text t = {0};
    frame_begin(&t);
    text_format(&t, "{\"type\":\"signal\",\"signal\":%d}", number);
    (void)send_frame(sock, &t, NULL, 0); /* a controller gone is told by the next receive */
    text_free(&t);
}

/* launch_dialogue._wait: the final frame; meanwhile each forwarded signal that comes (or came while
   the sandbox started, held until now) goes to the program as a "signal" frame. */
static void wait_final(int sock, struct json_value *out) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot make the signal pipe: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
    }
    signal_pipe = pipe_fds[1];
    for (size_t i = 0; i < FORWARDED_COUNT; i++)
        set_handler(FORWARDED[i], note_signal);
    mask_forwarded(SIG_UNBLOCK);
    for (;;) {
        struct pollfd ready[2] = {{.fd = sock, .events = POLLIN, .revents = 0},
                                  {.fd = pipe_fds[0], .events = POLLIN, .revents = 0}};
        if (poll(ready, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            lost(errno);
        }
        if (ready[1].revents & POLLIN) {
            unsigned char numbers[64];
            ssize_t n = read(pipe_fds[0], numbers, sizeof numbers);
            for (ssize_t i = 0; i < n; i++)
                forward(sock, numbers[i]);
        }
        if (ready[0].revents != 0) { /* a frame, EOF or an error: receive_frame tells which */
            mask_forwarded(SIG_BLOCK);
            receive_frame(sock, out);
            return;
        }
    }
}

void signals_start(void) {
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    if (sigemptyset(&ignore.sa_mask) != 0 || sigaction(SIGPIPE, &ignore, NULL) != 0)
        fail(EXIT_RUN_ERROR, "cannot ignore SIGPIPE");
    set_handler(SIGINT, interrupted);
}

void signals_hold(void) { mask_forwarded(SIG_BLOCK); }

/* --- the dialogue ------------------------------------------------------------------------ */

/* launch_dialogue.open_as_owner: open what the controller will bind, as this user (what this user
   cannot reach is refused here), and pass it back O_PATH. */
static void open_as_owner(int sock, const struct json_value *paths) {
    bool list = paths != NULL && paths->kind == JSON_ARRAY;
    for (size_t i = 0; list && i < paths->count; i++)
        list = paths->items[i].kind == JSON_STRING;
    if (!list)
        fail(EXIT_RUN_ERROR, "the controller asked to open something that is not a list of paths");
    size_t count = paths->count;
    if (count > MAX_FDS) {
        struct text m = message_start();
        text_format(&m, "%zu descriptors is over the limit of %d", count, MAX_FDS);
        message_exit(&m, EXIT_RUN_ERROR);
    }
    int fds[MAX_FDS];
    size_t last[MAX_FDS]; /* {path: i for i, path in enumerate(paths)}: a repeat keeps its
                             first place and takes the last index */
    bool first[MAX_FDS];
    for (size_t i = 0; i < count; i++) {
        const struct json_value *path = &paths->items[i];
        char *name = wtf8_file_name(path->text, path->length);
        fds[i] = name == NULL ? -1 : open(name, O_PATH | O_CLOEXEC);
        free(name);
        if (fds[i] < 0) {
            struct text m = message_start();
            text_str(&m, "cannot open ");
            text_printable(&m, path->text, path->length);
            text_format(&m, ": %s", strerror(errno));
            message_exit(&m, EXIT_RUN_ERROR);
        }
        first[i] = true;
        last[i] = i;
        for (size_t j = 0; j < i; j++) {
            if (first[j] && paths->items[j].length == path->length &&
                memcmp(paths->items[j].text, path->text, path->length) == 0) {
                first[i] = false;
                last[j] = i;
                break;
            }
        }
    }
    struct text t = {0};
    frame_begin(&t);
    text_str(&t, "{\"type\":\"opened\",\"grants\":{");
    bool any = false;
    for (size_t i = 0; i < count; i++) {
        if (!first[i])
            continue;
        if (any)
            text_str(&t, ",");
        any = true;
        json_put_wtf8(&t, paths->items[i].text, paths->items[i].length);
        text_format(&t, ":%zu", last[i]);
    }
    text_str(&t, "}}");
    frame_send(sock, &t, fds, count);
    text_free(&t);
    for (size_t i = 0; i < count; i++)
        close(fds[i]);
}

/* launch_dialogue.ask without a terminal (this path never has one on stdin): the lines, then the
   refusal. Signals are let through while the lines print, as Python's released_signals. */
__attribute__((noreturn)) static void refuse_approval(const struct json_value *lines) {
    struct text shown = {0};
    for (size_t i = 0; lines != NULL && lines->kind == JSON_ARRAY && i < lines->count; i++) {
        struct text line = {0};
        text_str_of(&line, &lines->items[i]);
        text_printable(&shown, line.data, line.length);
        text_str(&shown, "\n");
        text_free(&line);
    }
    mask_forwarded(SIG_UNBLOCK);
    write_all(2, shown.data, shown.length);
    mask_forwarded(SIG_BLOCK);
    fail(EXIT_RUN_REFUSED, "not approved: there is no terminal to ask on; "
                           "read what it opens (lnk spec show) and pass --yes to approve it");
}

/* A dry run's answer (`lnk spec approve` sends those; this path never does, but answers it as
   the dialogue does). */
__attribute__((noreturn)) static void approved(const struct json_value *message) {
    struct text hash = {0}, out = {0};
    text_str_of(&hash, json_get(message, "hash"));
    text_str(&out, truthy(json_get(message, "already")) ? "already approved: " : "approved: ");
    text_printable(&out, hash.data, wtf8_prefix(hash.data, hash.length, 16));
    text_str(&out, "\n");
    write_all(1, out.data, out.length);
    exit(0);
}

/* launch_dialogue._ended: the exit status, the controller's error, or a StateError. */
__attribute__((noreturn)) static void ended(const struct json_value *message) {
    const struct json_value *type = json_get(message, "type");
    if (json_is(type, LNK_FRAME_EXIT)) {
        /* launch_protocol.exit_status: 0-255 (128+N for a signal), or a bad frame; passed on,
           256 would read as a success. */
        const struct json_value *status = json_get(message, "status");
        if (status == NULL || status->kind != JSON_INT || status->integer < 0 ||
            status->integer > LNK_MAX_STATUS)
            bad_frame("an exit status that is not 0-255");
        const struct json_value *said = json_get(message, "message"); /* a limit it met */
        if (said != NULL) {
            struct text m = message_start(), text = {0};
            text_str_of(&text, said);
            text_printable(&m, text.data, text.length);
            message_exit(&m, (int)status->integer);
        }
        exit((int)status->integer);
    }
    struct text m = message_start();
    if (json_is(type, LNK_FRAME_ERROR)) { /* the status the controller chose for a run */
        const struct json_value *code = json_get(message, "run_exit");
        struct text said = {0};
        text_str_of(&said, json_get(message, "message"));
        text_printable(&m, said.data, said.length);
        bool usable = code != NULL && code->kind == JSON_INT && code->integer >= INT_MIN &&
                      code->integer <= INT_MAX;
        message_exit(&m, usable ? (int)code->integer : EXIT_RUN_ERROR);
    }
    text_str(&m, "unexpected answer from the controller: ");
    text_repr(&m, type);
    message_exit(&m, EXIT_RUN_ERROR);
}

void dialogue(int sock) {
    for (;;) {
        struct json_value message;
        receive_frame(sock, &message);
        const struct json_value *type = json_get(&message, "type");
        if (json_is(type, LNK_FRAME_OPEN)) {
            open_as_owner(sock, json_get(&message, "paths"));
        } else if (json_is(type, LNK_FRAME_APPROVE_QUESTION)) {
            refuse_approval(json_get(&message, "lines"));
        } else if (json_is(type, LNK_FRAME_APPROVED)) {
            approved(&message);
        } else if (json_is(type, LNK_FRAME_STARTED)) {
            struct json_value final;
            wait_final(sock, &final);
            ended(&final);
        } else {
            ended(&message);
        }
        json_free(&message);
    }
}
