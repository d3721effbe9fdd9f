/* lnk, the command: `lnk sandbox run`'s quick path and `lnk bridge` in C, the Python CLI for
 * everything else.
 *
 * Why: Python's own start costs 13-19 ms on a small machine before any of the client's code
 * runs, a third of a sandbox's start; and inside an agent's sandbox under a finite [commands]
 * list the box grants this program but never the Python behind it (box_client.py), so an
 * agent's bridge calls are made here (lnk_client_bridge.c, signed in lnk_client_proof.c).
 * The run path takes the form the Python quick path takes (cli/lnk_cli/launch_dialogue.py: `sandbox
 * run [--yes] [--spec FILE | --spec=FILE] -- PROGRAM [ARGS...]`) and --env NAME[=VALUE] too
 * (which the Python CLI reads in full: the request is the same, a test holds it), and only
 * when neither stdin nor stdout is a terminal (with one, the approval question or a pty relay
 * is possible: those stay in Python). Everything else execs
 * `<this program's folder>/python3 -P -c "from lnk_cli.__main__ import main; main()" WORDS...`
 * (-P: a folder named lnk_cli in the caller's working folder must not be imported).
 *
 * The quick path speaks what launch_dialogue._launch and launch_dialogue.dialogue speak, and
 * says what they say: the same request (byte for byte: tests/unit/lnk_cli/test_native_client.py
 * compares it with launch_request's), the same messages and exit codes. On the launch socket
 * ($LNK_RUN_DIR/launch.sock, /run/lnk by default) each frame is a 4-byte big-endian length and
 * a JSON object (lnk_client_json.c), descriptors passed with SCM_RIGHTS on its first byte
 * (lnk_client_dialogue.c); the frames, their fields and limits are lnk_shared/launch_protocol.py's
 * (lnk_launch_protocol.h is written from it):
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
#include "lnk_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#define LAUNCH_SOCKET LNK_LAUNCH_SOCKET
#define DEFAULT_RUN_DIR "/run/lnk"
#define PYTHON "python3" /* beside this program: the venv's, whose site-packages hold lnk_cli */
#define PYTHON_MAIN "from lnk_cli.__main__ import main; main()"
#define STDIO_FDS 3
#define SPEC_FD_INDEX 3 /* the spec file is passed after stdin, stdout and stderr */
/* lnk_shared.spec_size.MAX_SPEC_BYTES (a test holds them equal): a larger spec is not sent */
#define SPEC_MAX_BYTES (256 * 1024)

/* lnk_shared.spec_flags.FLAG_NAMES, each empty as argparse's defaults leave it (launch_dialogue's
   no_flags) but `env`, which holds the --env words; the unit test compares the whole request
   with Python's, so a new flag is caught. */
#define FLAGS_BEFORE_ENV                                                                           \
    "{\"read\":[],\"write\":[],\"internet_host\":[],\"network_mode\":null,\"lan_host\":[],"        \
    "\"browser_host\":[],\"port\":[],\"store_driver\":[],\"service\":[],\"model\":[],"             \
    "\"command\":[],\"with_fd\":[],\"env\":["
#define FLAGS_AFTER_ENV "],\"processes\":[],\"memory\":[],\"cpu\":[],\"open_files\":[]}"

extern char **environ;

struct plain_run {
    const char *spec; /* NULL or "": none (Python's `if spec:`) */
    bool yes;
    char **command;
    int count;
    const char **env; /* each --env word, in order (NAME=VALUE, or a NAME set here) */
    int env_count;
};

/* --- the words --------------------------------------------------------------------------- */

static const char *environment(const char *name);

/* An --env word this path sends as the Python CLI would (spec_flags.flags_document): NAME=VALUE
   as written, a bare NAME only when the caller's environment has it (env_names.env_flags'
   "not set" refusal is the Python CLI's to print). Names are judged by the controller. */
static bool env_word(const char *word, struct plain_run *out) {
    if (word[0] == '\0' || (strchr(word, '=') == NULL && environment(word) == NULL))
        return false;
    out->env[out->env_count++] = word;
    return true;
}

/* launch_dialogue.plain_run, and --env: `words` after `sandbox run` are `[--yes] [--spec F |
   --spec=F]... [--env E | --env=E]... -- PROGRAM [ARGS...]` in any order before the `--`;
   anything else (another spec flag, an abbreviation, --help, no program) is the full client's
   to read. */
static bool plain_run(int count, char **words, struct plain_run *out) {
    out->spec = NULL;
    out->yes = false;
    out->env_count = 0;
    out->env = calloc((size_t)count + 1, sizeof *out->env);
    if (out->env == NULL)
        fail(EXIT_RUN_ERROR, "out of memory");
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
        else if (strncmp(word, "--env=", 6) == 0 && env_word(word + 6, out))
            continue;
        else if (strcmp(word, "--env") == 0 && i + 1 < count && words[i + 1][0] != '-' &&
                 env_word(words[i + 1], out))
            i++;
        else
            return false;
    }
    return false;
}

/* lnk_cli.exit_statuses.runs_a_program: the commands that exit with their program's status. */
static bool runs_a_program(int argc, char **argv) {
    static const char *const runs[][2] = {{"sandbox", "run"}, {"sandbox", "enter"}, {"agent", "start"}};
    if (argc < 3)
        return false;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        if (strcmp(argv[1], runs[i][0]) == 0 && strcmp(argv[2], runs[i][1]) == 0)
            return true;
    return false;
}

/* Everything but the quick path: the Python CLI beside this program, with the same words. */
__attribute__((noreturn)) static void run_python_cli(int argc, char **argv) {
    int failed = runs_a_program(argc, argv) ? EXIT_RUN_ERROR : EXIT_ERROR;
    char python[PATH_MAX + sizeof "/" PYTHON];
    ssize_t n = readlink("/proc/self/exe", python, PATH_MAX); /* realpath: no symlink left */
    if (n < 0 || n >= PATH_MAX) {
        struct text m = message_start();
        text_format(&m, "cannot run the Python CLI (/proc/self/exe): %s",
                    strerror(n < 0 ? errno : ENAMETOOLONG));
        message_exit(&m, failed);
    }
    python[n] = '\0';
    char *slash = strrchr(python, '/');
    size_t folder = slash == NULL ? 0 : (size_t)(slash - python);
    memcpy(python + folder, "/" PYTHON, sizeof "/" PYTHON); /* fits: room for it is reserved */
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (args == NULL)
        fail(failed, "out of memory");
    args[0] = python;
    args[1] = "-P"; /* no caller's folder on sys.path */
    args[2] = "-c";
    args[3] = PYTHON_MAIN;
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    execv(python, args);
    int err = errno;
    struct text m = message_start();
    text_str(&m, "cannot run the Python CLI (");
    text_printable_bytes(&m, python, strlen(python));
    text_format(&m, "): %s", strerror(err));
    if (err == EACCES && argc >= 2 && strcmp(argv[1], "bridge") == 0) { /* box_client.py */
        text_str(&m, "; this sandbox's [commands] list does not grant it, and without it `lnk "
                     "bridge` takes its plain forms only:\n  ");
        text_str(&m, BRIDGE_USAGE);
        message_exit(&m, EXIT_USAGE);
    }
    if (err == EACCES && getenv("LNK_AGENT") != NULL) /* box_client.py: not granted */
        text_str(&m, " (this sandbox's [commands] list does not grant the box's Python, which "
                     "runs every lnk command but `lnk bridge` and `lnk sandbox run`: add "
                     "\"python3\" to it, or use \"*\")");
    message_exit(&m, failed);
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

/* launch_dialogue.launch_request(command, no_flags(), yes=yes), key for key and in the same
   order. */
static void launch_request(struct text *t, const struct plain_run *run, bool spec) {
    char *cwd = getcwd(NULL, 0);
    if (cwd == NULL) {
        struct text m = message_start();
        text_format(&m, "cannot read the current folder: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
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
    text_str(t, ",\"flags\":" FLAGS_BEFORE_ENV);
    for (int i = 0; i < run->env_count; i++) { /* env_flags: f"{name}={value}" */
        const char *word = run->env[i];
        if (i > 0)
            text_str(t, ",");
        if (strchr(word, '=') != NULL) {
            json_put_bytes(t, word, strlen(word));
            continue;
        }
        struct text entry = {0};
        text_str(&entry, word);
        text_str(&entry, "=");
        text_str(&entry, environment(word));
        json_put_bytes(t, entry.data, entry.length);
        text_free(&entry);
    }
    text_str(t, FLAGS_AFTER_ENV ",\"env\":{");
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

/* --- the quick path ---------------------------------------------------------------------- */

/* A closed stdin, stdout or stderr would be taken by the next descriptor opened (the lowest
   free number), and the launch socket itself passed to the sandbox as its stdio: /dev/null
   stands in for it. */
static void stdio_open(void) {
    for (int fd = 0; fd < STDIO_FDS; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int null = open("/dev/null", O_RDWR); /* the lowest free number: `fd` */
        if (null != fd) {
            struct text m = message_start();
            text_format(&m, "cannot open /dev/null for the closed descriptor %d: %s", fd,
                        null < 0 ? strerror(errno) : "it got another number");
            message_exit(&m, EXIT_RUN_ERROR);
        }
    }
}

/* The caller's terminal modes, saved before the launch and put back at every exit after it
   (lnk_cli/terminal_modes.py says why and what a SIGKILL leaves: nothing is put back then).
   This path runs only when neither stdin nor stdout is a terminal, so stderr may be one. */
static struct termios saved_modes[STDIO_FDS];
static bool modes_saved[STDIO_FDS];

static void restore_modes(void) {
    for (int fd = 0; fd < STDIO_FDS; fd++)
        if (modes_saved[fd])
            (void)tcsetattr(fd, TCSADRAIN, &saved_modes[fd]); /* a terminal gone: left alone */
}

static void save_modes(void) {
    for (int fd = 0; fd < STDIO_FDS; fd++)
        modes_saved[fd] = isatty(fd) && tcgetattr(fd, &saved_modes[fd]) == 0;
    if (atexit(restore_modes) != 0)
        fail(EXIT_RUN_ERROR, "cannot arrange for the terminal's modes to be put back");
}

/* The spec file, opened as this user and passed, not named: the controller reads what the
   caller could read. O_NONBLOCK: a FIFO in its place cannot hang the controller. */
static int open_spec(const char *spec) {
    int fd = open(spec, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) { /* SpecError(..., source=spec): exit 2 */
        struct text m = message_start();
        text_printable_bytes(&m, spec, strlen(spec));
        text_format(&m, ": cannot open the spec file: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
    }
    struct stat info; /* spec_size.refuse_oversized_spec: the controller refuses the rest */
    if (fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > SPEC_MAX_BYTES) {
        struct text m = message_start();
        text_printable_bytes(&m, spec, strlen(spec));
        text_format(&m, ": the spec is larger than %d bytes (%d KiB; ", SPEC_MAX_BYTES,
                    SPEC_MAX_BYTES / 1024);
        text_format(&m, "this one has %lld or more): a spec is a few lines of TOML, ",
                    (long long)info.st_size);
        text_format(&m, "so this is not one");
        message_exit(&m, EXIT_RUN_ERROR);
    }
    return fd;
}

/* A connection to $LNK_RUN_DIR/launch.sock (os.path.join's spelling), or the StateError. */
static int connect_launch_socket(void) {
    const char *run_dir = environment("LNK_RUN_DIR");
    if (run_dir == NULL || run_dir[0] == '\0')
        run_dir = DEFAULT_RUN_DIR;
    size_t dir_length = strlen(run_dir);
    bool slash = run_dir[dir_length - 1] == '/'; /* os.path.join adds none after one */
    size_t path_length = dir_length + !slash + strlen(LAUNCH_SOCKET);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        struct text m = message_start();
        text_format(&m, "cannot make a socket: %s", strerror(errno));
        message_exit(&m, EXIT_RUN_ERROR);
    }
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    if (path_length <= sizeof address.sun_path) { /* Python's limit: no room for a NUL needed */
        memcpy(address.sun_path, run_dir, dir_length);
        if (!slash)
            address.sun_path[dir_length] = '/';
        memcpy(address.sun_path + dir_length + !slash, LAUNCH_SOCKET, strlen(LAUNCH_SOCKET));
        socklen_t length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_length);
        if (connect(sock, (struct sockaddr *)&address, length) == 0)
            return sock;
    }
    struct text m = message_start();
    text_str(&m, "the box is not running (no launch socket in ");
    text_printable_bytes(&m, run_dir, dir_length);
    text_str(&m, "); start it with `lnk box up`");
    message_exit(&m, EXIT_RUN_ERROR);
}

/* launch_dialogue._launch, in its order: the request, the spec file, the socket, then signals held
   while the request goes and the dialogue answers the controller. */
__attribute__((noreturn)) static void quick_run(const struct plain_run *run) {
    signals_start();
    stdio_open();
    save_modes();
    bool spec = run->spec != NULL && run->spec[0] != '\0';
    struct text request = {0};
    launch_request(&request, run, spec);
    int fds[STDIO_FDS + 1] = {0, 1, 2, spec ? open_spec(run->spec) : -1};
    int sock = connect_launch_socket();
    signals_hold();
    frame_send(sock, &request, fds, spec ? STDIO_FDS + 1 : STDIO_FDS);
    text_free(&request);
    if (spec)
        close(fds[SPEC_FD_INDEX]);
    dialogue(sock);
}

int main(int argc, char **argv) {
    struct plain_run run;
    /* isatty on both: with a terminal on either, the question or a pty relay may be wanted. */
    if (argc >= 2 && strcmp(argv[1], "bridge") == 0)
        bridge_command(argc, argv); /* exits, but for a form the Python CLI must read */
    if (argc >= 3 && strcmp(argv[1], "sandbox") == 0 && strcmp(argv[2], "run") == 0 &&
        plain_run(argc - 3, argv + 3, &run) && !isatty(0) && !isatty(1))
        quick_run(&run);
    run_python_cli(argc, argv);
}
