/* lnk, the command: `lnk sandbox run`'s quick path in C, the Python CLI for everything else.
 *
 * Why: Python's own start costs 13-19 ms on a small machine before any of the client's code
 * runs, a third of a sandbox's start. This program takes exactly the form the Python quick path
 * takes (cli/lnk_cli/quick_run.py: `sandbox run [--yes] [--spec FILE | --spec=FILE] -- PROGRAM
 * [ARGS...]`), and only when neither stdin nor stdout is a terminal (with one, the approval
 * question or a pty relay is possible: those stay in Python). Everything else execs
 * `<this program's folder>/python3 -P -c "from lnk_cli.__main__ import main; main()" WORDS...`
 * (-P: a folder named lnk_cli in the caller's working folder must not be imported).
 *
 * The quick path speaks what quick_run._launch and quick_run.dialogue speak, and says what they
 * say: the same request (byte for byte: tests/unit/lnk_cli/test_native_client.py compares it
 * with launch_request's), the same messages and exit codes. On the launch socket
 * ($LNK_RUN_DIR/launch.sock, /run/lnk by default) each frame is a 4-byte big-endian length and
 * a JSON object (lnk_client_json.c), descriptors passed with SCM_RIGHTS on its first byte:
 *     -> {"type": "launch", ...} + stdin, stdout, stderr (+ the spec file, opened here)
 *     <- {"type": "open", "paths": [...]}  -> {"type": "opened", "grants": {path: i}} + O_PATH
 *     <- {"type": "approve?", ...}         (no terminal to ask on: refused, as in Python)
 *     <- {"type": "started", ...}          -> {"type": "signal", "signal": N}, any number
 *     <- {"type": "exit", "status": N}  |  {"type": "error", "exit": N, "message": M}
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT are held (blocked) from before the request is sent, so
 * one that comes while the sandbox starts is not lost, and forwarded to the program once it
 * has started; the client still exits with the program's status.
 *
 * Where it differs from Python on purpose: what Python would end with a traceback (a frame that
 * is not JSON, too many descriptors, a path that is no file name, the current folder gone) is
 * a one-line `lnk: ...` and exit 1 here; a closed stdin, stdout or stderr is passed on as
 * /dev/null, not as the launch socket that took its number; and the environment sent is the
 * caller's, where Python's own start adds LC_CTYPE=C.UTF-8 to its copy under a C locale
 * (PEP 538) and sends that.
 */
#define _GNU_SOURCE
#include "lnk_client_json.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* lnk_shared.frames and lnk_shared.errors */
#define MAX_FRAME (1 << 20) /* a launch request or reply is a few KiB; more is a bug or attack */
#define MAX_FDS 64          /* stdio, a spec file and the granted folders: far below this */
#define HEADER_BYTES 4      /* a frame's length, big-endian, before its JSON */
#define EXIT_ERROR 1        /* LnkError, StateError, NotConfirmedError */
#define EXIT_USAGE 2        /* SpecError */

#define LAUNCH_SOCKET "launch.sock"
#define DEFAULT_RUN_DIR "/run/lnk"
#define PYTHON "python3" /* beside this program: the venv's, whose site-packages hold lnk_cli */
#define PYTHON_MAIN "from lnk_cli.__main__ import main; main()"
#define STDIO_FDS 3
#define SPEC_FD_INDEX 3 /* the spec file is passed after stdin, stdout and stderr */

/* lnk_shared.spec_flags.FLAG_NAMES, each empty as argparse's defaults leave it (quick_run's
   no_flags); the unit test compares the whole request with Python's, so a new flag is caught. */
#define NO_FLAGS                                                                                   \
    "{\"read\":[],\"write\":[],\"internet_host\":[],\"network_mode\":null,\"lan_host\":[],"        \
    "\"browser_host\":[],\"port\":[],\"store_driver\":[],\"command\":[],\"with_fd\":[]}"

static const int FORWARDED[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define FORWARDED_COUNT (sizeof FORWARDED / sizeof FORWARDED[0])

extern char **environ;

struct plain_run {
    const char *spec; /* NULL or "": none (Python's `if spec:`) */
    bool yes;
    char **command;
    int count;
};

/* --- messages ---------------------------------------------------------------------------- */

static void write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* stderr gone: Python's BrokenPipeError ends quietly too */
        data += n;
        length -= (size_t)n;
    }
}

static struct text message_start(void) {
    struct text m = {0};
    text_str(&m, "lnk: ");
    return m;
}

/* Print `m` and a newline on stderr and exit with `code`. */
__attribute__((noreturn)) static void message_exit(struct text *m, int code) {
    text_str(m, "\n");
    write_all(2, m->data, m->length);
    exit(code);
}

/* `lnk: WHAT` and exit with `code`, for a message with nothing the caller gave in it. */
__attribute__((noreturn)) static void fail(int code, const char *what) {
    struct text m = message_start();
    text_str(&m, what);
    message_exit(&m, code);
}

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
    message_exit(&m, EXIT_ERROR);
}

/* The controller sent what no frame may be: a clean error, never a crash or a hang. */
__attribute__((noreturn)) static void bad_frame(const char *why) {
    struct text m = message_start();
    text_str(&m, "the controller sent a bad frame (");
    text_str(&m, why);
    text_str(&m, "); see its log");
    message_exit(&m, EXIT_ERROR);
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

/* --- the words --------------------------------------------------------------------------- */

/* quick_run.plain_run: `words` after `sandbox run` are `[--yes] [--spec F | --spec=F]... --
   PROGRAM [ARGS...]` in any order before the `--`; anything else (a spec flag, an abbreviation,
   --help, no program) is the full client's to read. */
static bool plain_run(int count, char **words, struct plain_run *out) {
    out->spec = NULL;
    out->yes = false;
    for (int i = 0; i < count; i++) {
        const char *word = words[i];
        if (strcmp(word, "--") == 0) {
            out->command = words + i + 1;
            out->count = count - i - 1;
            return out->count > 0;
        }
        if (strcmp(word, "--yes") == 0)
            out->yes = true;
        else if (strncmp(word, "--spec=", 7) == 0 && word[7] != '\0')
            out->spec = word + 7;
        else if (strcmp(word, "--spec") == 0 && i + 1 < count && words[i + 1][0] != '-')
            out->spec = words[++i];
        else
            return false;
    }
    return false;
}

/* Everything but the quick path: the Python CLI beside this program, with the same words. */
__attribute__((noreturn)) static void run_python_cli(int argc, char **argv) {
    char python[PATH_MAX + sizeof "/" PYTHON];
    ssize_t n = readlink("/proc/self/exe", python, PATH_MAX); /* realpath: no symlink left */
    if (n < 0 || n >= PATH_MAX) {
        struct text m = message_start();
        text_format(&m, "cannot run the Python CLI (/proc/self/exe): %s",
                    strerror(n < 0 ? errno : ENAMETOOLONG));
        message_exit(&m, EXIT_ERROR);
    }
    python[n] = '\0';
    char *slash = strrchr(python, '/');
    size_t folder = slash == NULL ? 0 : (size_t)(slash - python);
    memcpy(python + folder, "/" PYTHON, sizeof "/" PYTHON); /* fits: room for it is reserved */
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (args == NULL)
        fail(EXIT_ERROR, "out of memory");
    args[0] = python;
    args[1] = "-P"; /* no caller's folder on sys.path */
    args[2] = "-c";
    args[3] = PYTHON_MAIN;
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    execv(python, args);
    struct text m = message_start();
    text_str(&m, "cannot run the Python CLI (");
    text_printable_bytes(&m, python, strlen(python));
    text_format(&m, "): %s", strerror(errno));
    message_exit(&m, EXIT_ERROR);
}

/* --- the request ------------------------------------------------------------------------- */

/* os.environ's value of `name` (the first entry: Python keeps the first of duplicates too),
   or NULL. */
static const char *environment(const char *name) {
    size_t length = strlen(name);
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, name, length) == 0 && (*e)[length] == '=')
            return *e + length + 1;
    return NULL;
}

/* The terminal's and the locale's variables (launch_request's env): TERM, LANG, LC_*. */
static bool passed_on(const char *entry, size_t key_length) {
    return (key_length == 4 && strncmp(entry, "TERM", 4) == 0) ||
           (key_length == 4 && strncmp(entry, "LANG", 4) == 0) || strncmp(entry, "LC_", 3) == 0;
}

/* An earlier entry of the environment has the same name (os.environ keeps the first). */
static bool seen_before(char **entry, size_t key_length) {
    for (char **e = environ; e < entry; e++)
        if (strncmp(*e, *entry, key_length + 1) == 0) /* the name and its '=' */
            return true;
    return false;
}

/* Frames are built with their header's room first, filled in by send_frame. */
static void frame_begin(struct text *t) { text_bytes(t, "\0\0\0\0", HEADER_BYTES); }

/* quick_run.launch_request(command, no_flags(), yes=yes), key for key and in the same order. */
static void launch_request(struct text *t, const struct plain_run *run, bool spec) {
    char *cwd = getcwd(NULL, 0);
    if (cwd == NULL) {
        struct text m = message_start();
        text_format(&m, "cannot read the current folder: %s", strerror(errno));
        message_exit(&m, EXIT_ERROR);
    }
    const char *path = environment("PATH");
    frame_begin(t);
    text_str(t, "{\"type\":\"launch\",\"argv\":[");
    for (int i = 0; i < run->count; i++) {
        if (i > 0)
            text_str(t, ",");
        json_put_bytes(t, run->command[i], strlen(run->command[i]));
    }
    text_str(t, "],\"cwd\":");
    json_put_bytes(t, cwd, strlen(cwd));
    free(cwd);
    text_str(t, ",\"path_env\":");
    json_put_bytes(t, path ? path : "", path ? strlen(path) : 0);
    text_str(t, ",\"flags\":" NO_FLAGS ",\"env\":{");
    bool first = true;
    for (char **e = environ; *e != NULL; e++) {
        const char *equals = strchr(*e, '=');
        if (equals == NULL) /* no value: os.environ skips it */
            continue;
        size_t key_length = (size_t)(equals - *e);
        if (!passed_on(*e, key_length) || seen_before(e, key_length))
            continue;
        if (!first)
            text_str(t, ",");
        first = false;
        json_put_bytes(t, *e, key_length);
        text_str(t, ":");
        json_put_bytes(t, equals + 1, strlen(equals + 1));
    }
    text_format(t, "},\"terminal\":null,\"yes\":%s,\"dry\":false,", run->yes ? "true" : "false");
    text_str(t, "\"fds\":{\"stdin\":0,\"stdout\":1,\"stderr\":2");
    if (spec)
        text_format(t, ",\"spec\":%d", SPEC_FD_INDEX);
    text_str(t, "},\"with_fds\":{}}");
}

/* --- frames ------------------------------------------------------------------------------ */

/* Send the frame in `t` (frame_begin's room, then its JSON) with `fds` on its first byte:
   0, or an errno. A frame over MAX_FRAME ends the client (Python's ValueError). */
static int send_frame(int sock, struct text *t, const int *fds, size_t count) {
    size_t length = t->length - HEADER_BYTES;
    if (length > MAX_FRAME) {
        struct text m = message_start();
        text_format(&m, "frame of %zu bytes is over the limit of %d", length, MAX_FRAME);
        message_exit(&m, EXIT_ERROR);
    }
    if (count > MAX_FDS) {
        struct text m = message_start();
        text_format(&m, "%zu descriptors is over the limit of %d", count, MAX_FDS);
        message_exit(&m, EXIT_ERROR);
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

static void send_or_exit(int sock, struct text *t, const int *fds, size_t count) {
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
        fail(EXIT_ERROR, "out of memory");
    read_exactly(sock, body, length);
    const char *why = NULL;
    if (json_parse((const char *)body, length, out, &why) != 0)
        bad_frame(why);
    free(body);
}

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

/* Python's KeyboardInterrupt before the signals are held: `lnk: interrupted`, exit 1. */
static void interrupted(int number) {
    (void)number;
    static const char message[] = "lnk: interrupted\n";
    ssize_t ignored = write(2, message, sizeof message - 1);
    (void)ignored;
    _exit(EXIT_ERROR);
}

static void set_handler(int number, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART; /* a frame being read goes on after a forwarded signal */
    if (sigemptyset(&action.sa_mask) != 0 || sigaction(number, &action, NULL) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot set a signal handler: %s", strerror(errno));
        message_exit(&m, EXIT_ERROR);
    }
}

/* quick_run's held_signals (SIG_BLOCK) and released_signals (SIG_UNBLOCK). */
static void mask_forwarded(int how) {
    sigset_t set;
    if (sigemptyset(&set) != 0)
        fail(EXIT_ERROR, "cannot hold the signals");
    for (size_t i = 0; i < FORWARDED_COUNT; i++)
        if (sigaddset(&set, FORWARDED[i]) != 0)
            fail(EXIT_ERROR, "cannot hold the signals");
    if (sigprocmask(how, &set, NULL) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot hold the signals: %s", strerror(errno));
        message_exit(&m, EXIT_ERROR);
    }
}

static void forward(int sock, int number) {
    struct text t = {0};
    frame_begin(&t);
    text_format(&t, "{\"type\":\"signal\",\"signal\":%d}", number);
    (void)send_frame(sock, &t, NULL, 0); /* a controller gone is told by the next receive */
    text_free(&t);
}

/* quick_run._wait: the final frame; meanwhile each forwarded signal that comes (or came while
   the sandbox started, held until now) goes to the program as a "signal" frame. */
static void wait_final(int sock, struct json_value *out) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        struct text m = message_start();
        text_format(&m, "cannot make the signal pipe: %s", strerror(errno));
        message_exit(&m, EXIT_ERROR);
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

/* --- the dialogue ------------------------------------------------------------------------ */

/* quick_run.open_as_owner: open what the controller will bind, as this user (what this user
   cannot reach is refused here), and pass it back O_PATH. */
static void open_as_owner(int sock, const struct json_value *paths) {
    bool list = paths != NULL && paths->kind == JSON_ARRAY;
    for (size_t i = 0; list && i < paths->count; i++)
        list = paths->items[i].kind == JSON_STRING;
    if (!list)
        fail(EXIT_ERROR, "the controller asked to open something that is not a list of paths");
    size_t count = paths->count;
    if (count > MAX_FDS) {
        struct text m = message_start();
        text_format(&m, "%zu descriptors is over the limit of %d", count, MAX_FDS);
        message_exit(&m, EXIT_ERROR);
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
            message_exit(&m, EXIT_ERROR);
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
    send_or_exit(sock, &t, fds, count);
    text_free(&t);
    for (size_t i = 0; i < count; i++)
        close(fds[i]);
}

/* quick_run.ask without a terminal (this path never has one on stdin): the lines, then the
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
    fail(EXIT_ERROR, "not approved: there is no terminal to ask on; "
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

/* quick_run._ended: the exit status, the controller's error, or a StateError. */
__attribute__((noreturn)) static void ended(const struct json_value *message) {
    const struct json_value *type = json_get(message, "type");
    if (json_is(type, "exit")) {
        const struct json_value *status = json_get(message, "status");
        bool usable = status != NULL && status->kind == JSON_INT && status->integer >= INT_MIN &&
                      status->integer <= INT_MAX;
        exit(usable ? (int)status->integer : EXIT_ERROR);
    }
    struct text m = message_start();
    if (json_is(type, "error")) {
        const struct json_value *code = json_get(message, "exit");
        struct text said = {0};
        text_str_of(&said, json_get(message, "message"));
        text_printable(&m, said.data, said.length);
        bool usable = code != NULL && code->kind == JSON_INT && code->integer >= INT_MIN &&
                      code->integer <= INT_MAX;
        message_exit(&m, usable ? (int)code->integer : EXIT_ERROR);
    }
    text_str(&m, "unexpected answer from the controller: ");
    text_repr(&m, type);
    message_exit(&m, EXIT_ERROR);
}

__attribute__((noreturn)) static void dialogue(int sock) {
    for (;;) {
        struct json_value message;
        receive_frame(sock, &message);
        const struct json_value *type = json_get(&message, "type");
        if (json_is(type, "open")) {
            open_as_owner(sock, json_get(&message, "paths"));
        } else if (json_is(type, "approve?")) {
            refuse_approval(json_get(&message, "lines"));
        } else if (json_is(type, "approved")) {
            approved(&message);
        } else if (json_is(type, "started")) {
            struct json_value final;
            wait_final(sock, &final);
            ended(&final);
        } else {
            ended(&message);
        }
        json_free(&message);
    }
}

/* --- the quick path ---------------------------------------------------------------------- */

__attribute__((noreturn)) static void quick_run(const struct plain_run *run) {
    /* Python ignores SIGPIPE (a closed stderr or socket is an error, not a death) and turns
       Ctrl-C into "lnk: interrupted" until the signals are held. */
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    if (sigemptyset(&ignore.sa_mask) != 0 || sigaction(SIGPIPE, &ignore, NULL) != 0)
        fail(EXIT_ERROR, "cannot ignore SIGPIPE");
    set_handler(SIGINT, interrupted);
    /* A closed stdin, stdout or stderr would be taken by the next descriptor opened (the lowest
       free number), and the launch socket itself passed to the sandbox as its stdio: /dev/null
       stands in for it. (Python's client does pass the socket: one of the two deliberate
       differences, with the tracebacks named above.) */
    for (int fd = 0; fd < STDIO_FDS; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int null = open("/dev/null", O_RDWR); /* the lowest free number: `fd` */
        if (null != fd) {
            struct text m = message_start();
            text_format(&m, "cannot open /dev/null for a closed descriptor %d: %s", fd,
                        null < 0 ? strerror(errno) : "it got another number");
            message_exit(&m, EXIT_ERROR);
        }
    }

    bool spec = run->spec != NULL && run->spec[0] != '\0';
    struct text request = {0};
    launch_request(&request, run, spec);
    int fds[STDIO_FDS + 1] = {0, 1, 2, -1};
    if (spec) {
        fds[SPEC_FD_INDEX] = open(run->spec, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fds[SPEC_FD_INDEX] < 0) { /* SpecError(..., source=spec) */
            struct text m = message_start();
            text_printable_bytes(&m, run->spec, strlen(run->spec));
            text_format(&m, ": cannot open the spec file: %s", strerror(errno));
            message_exit(&m, EXIT_USAGE);
        }
    }

    const char *run_dir = environment("LNK_RUN_DIR");
    if (run_dir == NULL || run_dir[0] == '\0')
        run_dir = DEFAULT_RUN_DIR;
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    size_t dir_length = strlen(run_dir);
    bool slash = run_dir[dir_length - 1] == '/'; /* os.path.join adds none after one */
    size_t path_length = dir_length + !slash + strlen(LAUNCH_SOCKET);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        struct text m = message_start();
        text_format(&m, "cannot make a socket: %s", strerror(errno));
        message_exit(&m, EXIT_ERROR);
    }
    bool connected = false;
    if (path_length <= sizeof address.sun_path) { /* Python's limit: no room for a NUL needed */
        memcpy(address.sun_path, run_dir, dir_length);
        if (!slash)
            address.sun_path[dir_length] = '/';
        memcpy(address.sun_path + dir_length + !slash, LAUNCH_SOCKET, strlen(LAUNCH_SOCKET));
        socklen_t length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_length);
        connected = connect(sock, (struct sockaddr *)&address, length) == 0;
    }
    if (!connected) {
        struct text m = message_start();
        text_str(&m, "the box is not running (no launch socket in ");
        text_printable_bytes(&m, run_dir, dir_length);
        text_str(&m, "); start it with `lnk box up`");
        message_exit(&m, EXIT_ERROR);
    }

    mask_forwarded(SIG_BLOCK); /* held from here until the sandbox has started */
    send_or_exit(sock, &request, fds, spec ? STDIO_FDS + 1 : STDIO_FDS);
    text_free(&request);
    if (spec)
        close(fds[SPEC_FD_INDEX]);
    dialogue(sock);
}

int main(int argc, char **argv) {
    struct plain_run run;
    /* isatty on both: with a terminal on either, the question or a pty relay may be wanted. */
    if (argc >= 3 && strcmp(argv[1], "sandbox") == 0 && strcmp(argv[2], "run") == 0 &&
        plain_run(argc - 3, argv + 3, &run) && !isatty(0) && !isatty(1))
        quick_run(&run);
    run_python_cli(argc, argv);
}
