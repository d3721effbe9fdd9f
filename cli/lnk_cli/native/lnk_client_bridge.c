/* `lnk bridge ...` in C (lnk_client.h): an agent's calls to its bridges from inside its
 * sandbox, signed with its own key (lnk_client_proof.c), without the Python CLI, which a finite
 * [commands] list does not grant (box_client.py). What cli/lnk_cli/bridge_commands.py and
 * lnk_shared.proof_client do, in their order and with their messages and exit codes: the words,
 * each event read as JSON, LNK_AGENT, the key (LNK_AGENT_KEY), the bridge (LNK_BRIDGE), one
 * frame out and one back, the result printed as JSON (indent 2), or the bridge's refusal.
 *
 * The words taken here are the plain forms (bridge_usage): each positional in one run, each
 * option by its whole name (`--token 3` or `--token=3`), whole numbers in decimal. Anything
 * else (--help, an abbreviation, a word argparse might read another way) goes to the Python
 * CLI, as before; where that cannot run (a finite list), the plain forms are named instead.
 *
 * Where it differs from Python on purpose: an argument that is not UTF-8 is a usage error here
 * (Python fails encoding it, with its "this is a bug" line), and a JSON event's error says
 * what is wrong in this parser's words, not json's.
 *
 * What this does NOT do: retry (a retried append could land twice), or judge what the bridge
 * answers beyond reading it as JSON (the bridge is the box's own service).
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_KEY "/run/lnk-agent/key.pem"   /* bridge_commands.DEFAULT_KEY */
#define DEFAULT_BRIDGE "127.0.0.1:3129"        /* bridge_commands.DEFAULT_BRIDGE */
#define LOOPBACK "127.0.0.1"                   /* proof_client.LOOPBACK */
#define CALL_TIMEOUT_S 30                      /* proof_client.CALL_TIMEOUT_S */
#define EVENT_SHOWN_CHARS 40                   /* cmd_append's text[:40] */
#define MAX_OPTIONS 4                          /* the most any bridge operation takes */
#define MAX_INT_DIGITS 18                      /* fits a long long: larger goes to Python */

extern char **environ;

enum kind { OPT_INT, OPT_STR };

struct option_spec {
    const char *name; /* "--token" */
    enum kind kind;
    const char *value; /* the default's text, or NULL: not given */
};

struct words {
    char **positional;
    int count;
    struct option_spec options[MAX_OPTIONS];
    int option_count;
};

static const char *env_value(const char *name) {
    size_t length = strlen(name);
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, name, length) == 0 && (*e)[length] == '=')
            return *e + length + 1;
    return NULL;
}

static bool whole_number(const char *s) {
    const char *d = s + (s[0] == '-');
    size_t n = strlen(d);
    if (n == 0 || n > MAX_INT_DIGITS)
        return false;
    for (size_t i = 0; i < n; i++)
        if (d[i] < '0' || d[i] > '9')
            return false;
    return true;
}

/* argparse's negative-number pattern, ^-\d+$|^-\d*\.\d+$ (ASCII digits: \d takes others,
   which go to Python then). */
static bool negative_number(const char *s) {
    if (s[0] != '-')
        return false;
    const char *p = s + 1, *dot = strchr(p, '.');
    size_t before = dot ? (size_t)(dot - p) : strlen(p), after = dot ? strlen(dot + 1) : 0;
    for (size_t i = 0; i < before; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    for (size_t i = 0; dot && i < after; i++)
        if (dot[1 + i] < '0' || dot[1 + i] > '9')
            return false;
    return dot ? after > 0 : before > 0;
}

/* A word argparse reads as a value, not as an option (_parse_optional): no leading '-', "-"
   alone, a negative number, or a word with a space. */
static bool a_value(const char *s) {
    return s[0] != '-' || s[1] == '\0' || negative_number(s) || strchr(s, ' ') != NULL;
}

static struct option_spec *find_option(struct words *w, const char *word, size_t length) {
    for (int i = 0; i < w->option_count; i++)
        if (strlen(w->options[i].name) == length && strncmp(w->options[i].name, word, length) == 0)
            return &w->options[i];
    return NULL;
}

/* The plain form: options (whole names) anywhere, positionals in one run of `min`..`max`
   words (max < 0: no limit). False for anything else: the Python CLI's to read. */
static bool take_words(int argc, char **argv, struct words *w, int min, int max) {
    int first = -1, last = -1;
    for (int i = 0; i < argc; i++) {
        const char *word = argv[i];
        if (a_value(word)) {
            if (first >= 0 && last != i - 1)
                return false; /* positionals split by an option */
            if (first < 0)
                first = i;
            last = i;
            continue;
        }
        const char *equals = strchr(word, '=');
        size_t length = equals ? (size_t)(equals - word) : strlen(word);
        struct option_spec *o = word[1] == '-' ? find_option(w, word, length) : NULL;
        if (o == NULL)
            return false;
        const char *value = equals ? equals + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (value == NULL || (!equals && !a_value(value)))
            return false;
        if (o->kind == OPT_INT && !whole_number(value))
            return false; /* argparse's int() reads more spellings: Python's to judge */
        o->value = value;
    }
    w->count = first < 0 ? 0 : last - first + 1;
    w->positional = first < 0 ? argv : argv + first;
    return w->count >= min && (max < 0 || w->count <= max);
}

static const char *option(const struct words *w, const char *name) {
    for (int i = 0; i < w->option_count; i++)
        if (strcmp(w->options[i].name, name) == 0)
            return w->options[i].value;
    return NULL;
}

/* An argument into the body as a JSON string (ensure_ascii=False), or a usage error. */
static void put_argument(struct text *body, const char *what, const char *s) {
    const char *why = NULL;
    struct json_value v = {.kind = JSON_STRING, .text = (char *)s, .length = strlen(s)};
    if (!utf8_valid(s, v.length) || json_put_canonical(body, &v, &why) != 0) {
        struct text m = message_start();
        text_format(&m, "the %s ", what);
        text_printable_bytes(&m, s, strlen(s));
        text_str(&m, " is not UTF-8 text: write it as UTF-8");
        message_exit(&m, EXIT_USAGE);
    }
}

static void put_int(struct text *body, const char *s) {
    text_format(body, "%lld", strtoll(s, NULL, 10)); /* int("007") is 7 */
}

/* cmd_append's json.loads of each event, written back as encode_body writes it. */
static void put_event(struct text *body, const char *event) {
    struct json_value value;
    const char *why = NULL;
    size_t length = strlen(event);
    bool utf8 = utf8_valid(event, length);
    if (!utf8)
        why = "bytes that are not UTF-8";
    else if (json_parse_value(event, length, &value, &why, JSON_LAST_WINS) == 0) {
        int written = json_put_canonical(body, &value, &why);
        json_free(&value);
        if (written == 0)
            return;
    }
    struct text m = message_start();
    text_str(&m, "event ");
    if (utf8)
        text_repr_string(&m, event, wtf8_prefix(event, length, EVENT_SHOWN_CHARS));
    else
        text_printable_bytes(&m, event, length);
    text_str(&m, " is not JSON: ");
    text_str(&m, why);
    message_exit(&m, EXIT_USAGE);
}

/* What a refusal or the bridge's own message shows: display.shown_lines for ASCII, each other
   control character as \xNN (\t, \r as themselves escaped), line breaks kept. */
static void put_shown(struct text *m, const char *s, size_t length) {
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\t')
            text_str(m, "\\t");
        else if (c == '\r')
            text_str(m, "\\r");
        else if (c == '\n' || (c >= 0x20 && c != 0x7f))
            text_bytes(m, (const char *)&c, 1);
        else
            text_format(m, "\\x%02x", c);
    }
}

struct address {
    bool unix_socket;
    const char *path;
    int port;
};

/* proof_client.bridge_address */
static struct address bridge_address(const char *text) {
    struct address a = {text[0] == '/', text, 0};
    if (a.unix_socket)
        return a;
    const char *colon = strrchr(text, ':');
    size_t host = colon ? (size_t)(colon - text) : 0;
    const char *port = colon ? colon + 1 : text;
    bool digits = port[0] != '\0' && strlen(port) <= 5;
    for (const char *p = port; *p && digits; p++)
        digits = *p >= '0' && *p <= '9';
    a.port = digits ? atoi(port) : 0;
    if (colon == NULL || host != strlen(LOOPBACK) || strncmp(text, LOOPBACK, host) != 0 ||
        a.port <= 0 || a.port >= 65536) {
        struct text m = message_start();
        text_repr_string(&m, text, strlen(text));
        text_str(&m, " is neither a socket path nor " LOOPBACK ":PORT");
        message_exit(&m, EXIT_ERROR);
    }
    return a;
}

__attribute__((noreturn)) static void unreachable(const struct address *a, const char *why,
                                                  int err) {
    struct text m = message_start();
    text_str(&m, "cannot reach the bridge at ");
    if (a->unix_socket)
        text_printable_bytes(&m, a->path, strlen(a->path));
    else
        text_format(&m, "('" LOOPBACK "', %d)", a->port);
    text_str(&m, ": ");
    if (why != NULL)
        text_str(&m, why);
    else if (err == EAGAIN || err == EWOULDBLOCK || err == EINPROGRESS)
        text_str(&m, "timed out");
    else
        text_format(&m, "[Errno %d] %s", err, strerror(err));
    message_exit(&m, EXIT_ERROR);
}

static int connect_bridge(const struct address *a) {
    int sock = socket(a->unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        unreachable(a, NULL, errno);
    struct timeval timeout = {CALL_TIMEOUT_S, 0};
    (void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout); /* connect too */
    (void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    int rc;
    if (a->unix_socket) {
        struct sockaddr_un address = {.sun_family = AF_UNIX};
        size_t length = strlen(a->path);
        if (length >= sizeof address.sun_path)
            unreachable(a, "AF_UNIX path too long", 0);
        memcpy(address.sun_path, a->path, length);
        rc = connect(sock, (struct sockaddr *)&address, sizeof address);
    } else {
        struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(sock, (struct sockaddr *)&address, sizeof address);
    }
    if (rc != 0)
        unreachable(a, NULL, errno);
    return sock;
}

static void send_all(int sock, const struct address *a, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = send(sock, data, length, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            unreachable(a, NULL, n < 0 ? errno : EPIPE);
        data += n;
        length -= (size_t)n;
    }
}

static void recv_exact(int sock, const struct address *a, char *out, size_t length) {
    while (length > 0) {
        ssize_t n = recv(sock, out, length, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            unreachable(a, NULL, errno);
        if (n == 0)
            unreachable(a, "the peer closed the connection", 0);
        out += n;
        length -= (size_t)n;
    }
}

/* Ctrl-C as the Python CLI ends on it (launch_dialogue.reported): its message, status 1. */
static void interrupted(int number) {
    (void)number;
    static const char message[] = "lnk: interrupted\n";
    ssize_t ignored = write(2, message, sizeof message - 1);
    (void)ignored;
    _exit(EXIT_ERROR);
}

/* SIGPIPE ignored (a closed stdout is an error to see, as Python's BrokenPipeError), SIGINT as
   Python's KeyboardInterrupt. */
static void bridge_signals(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    sigemptyset(&action.sa_mask);
    action.sa_handler = SIG_IGN;
    bool ok = sigaction(SIGPIPE, &action, NULL) == 0;
    action.sa_handler = interrupted;
    if (!ok || sigaction(SIGINT, &action, NULL) != 0)
        fail(EXIT_ERROR, "cannot set the signals' handlers");
}

/* proof_client.call_bridge: one signed call; prints the result, or exits with the refusal. */
__attribute__((noreturn)) static void call(const char *audience, const char *action,
                                           struct text *body) {
    bridge_signals();
    const char *agent = env_value("LNK_AGENT");
    if (agent == NULL || agent[0] == '\0')
        fail(EXIT_USAGE, "LNK_AGENT is not set: `lnk bridge` runs inside an agent's sandbox");
    const char *key_path = env_value("LNK_AGENT_KEY");
    if (key_path == NULL || key_path[0] == '\0')
        key_path = DEFAULT_KEY;
    unsigned char seed[32];
    struct text why = {0};
    if (agent_key_read(key_path, seed, &why) != 0) {
        struct text m = message_start();
        text_bytes(&m, why.data, why.length);
        message_exit(&m, EXIT_ERROR);
    }
    const char *bridge = env_value("LNK_BRIDGE");
    struct address a = bridge_address(bridge != NULL && bridge[0] != '\0' ? bridge : DEFAULT_BRIDGE);
    struct proof_call proof = {agent, audience, action, body->data, body->length};
    struct text frame = {0};
    frame_begin(&frame);
    int signed_ok = proof_sign(&frame, &proof, seed, (long long)time(NULL), NULL);
    sodium_memzero(seed, sizeof seed);
    if (signed_ok != 0)
        fail(EXIT_ERROR, "cannot sign the call (no randomness, or the key is not a key)");
    size_t length = frame.length - HEADER_BYTES;
    if (length > MAX_FRAME) {
        char said[96];
        snprintf(said, sizeof said, "frame of %zu bytes is over the limit of %d", length,
                 MAX_FRAME);
        unreachable(&a, said, 0);
    }
    for (int i = 0; i < HEADER_BYTES; i++)
        frame.data[i] = (char)(length >> (8 * (HEADER_BYTES - 1 - i)));
    int sock = connect_bridge(&a);
    send_all(sock, &a, frame.data, frame.length);
    text_free(&frame);
    unsigned char header[HEADER_BYTES];
    recv_exact(sock, &a, (char *)header, HEADER_BYTES);
    size_t answer_length = (size_t)header[0] << 24 | (size_t)header[1] << 16 |
                           (size_t)header[2] << 8 | header[3];
    if (answer_length > MAX_FRAME) {
        char said[96];
        snprintf(said, sizeof said, "frame of %zu bytes is over the limit of %d", answer_length,
                 MAX_FRAME);
        unreachable(&a, said, 0);
    }
    char *answer = malloc(answer_length + 1);
    if (answer == NULL)
        out_of_memory();
    recv_exact(sock, &a, answer, answer_length);
    close(sock);
    struct json_value reply;
    const char *bad = NULL;
    if (json_parse_value(answer, answer_length, &reply, &bad, 0) != 0)
        unreachable(&a, bad, 0);
    free(answer);
    if (reply.kind != JSON_OBJECT)
        unreachable(&a, "a frame must be a JSON object", 0);
    const struct json_value *ok = json_get(&reply, "ok");
    if (ok != NULL && ok->kind == JSON_TRUE) {
        const struct json_value *result = json_get(&reply, "result");
        struct json_value null = {.kind = JSON_NULL};
        struct text out = {0};
        if (json_put_pretty(&out, result != NULL ? result : &null, 0, &bad) != 0)
            unreachable(&a, bad, 0);
        text_str(&out, "\n");
        for (size_t at = 0; at < out.length;) { /* print(): a reader gone is a quiet failure */
            ssize_t n = write(1, out.data + at, out.length - at);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                exit(EXIT_ERROR);
            at += (size_t)n;
        }
        exit(0);
    }
    const struct json_value *error = json_get(&reply, "error");
    struct text m = message_start();
    if (error != NULL && error->kind == JSON_STRING)
        put_shown(&m, error->text, error->length);
    else
        text_str(&m, "the bridge answered with an error");
    message_exit(&m, EXIT_ERROR);
}

/* bridge_commands' handlers, word for word: false when the words are not a plain form. */
static bool store(int argc, char **argv) {
    struct words w = {0};
    struct text body = {0};
    if (strcmp(argv[0], "append") == 0) {
        w.options[0] = (struct option_spec){"--expected-seq", OPT_INT, NULL};
        w.options[1] = (struct option_spec){"--token", OPT_INT, NULL};
        w.option_count = 2;
        if (!take_words(argc - 1, argv + 1, &w, 2, -1) || !option(&w, "--expected-seq") ||
            !option(&w, "--token"))
            return false;
        text_str(&body, "{\"conversation\":");
        put_argument(&body, "conversation", w.positional[0]);
        text_str(&body, ",\"events\":[");
        for (int i = 1; i < w.count; i++) {
            if (i > 1)
                text_str(&body, ",");
            put_event(&body, w.positional[i]);
        }
        text_str(&body, "],\"expected_seq\":");
        put_int(&body, option(&w, "--expected-seq"));
        text_str(&body, ",\"token\":");
        put_int(&body, option(&w, "--token"));
        text_str(&body, "}");
        call("store", "append", &body);
    }
    if (strcmp(argv[0], "read") == 0) {
        w.options[0] = (struct option_spec){"--from", OPT_INT, "1"};
        w.options[1] = (struct option_spec){"--limit", OPT_INT, "100"};
        w.option_count = 2;
        if (!take_words(argc - 1, argv + 1, &w, 1, 1))
            return false;
        text_str(&body, "{\"conversation\":");
        put_argument(&body, "conversation", w.positional[0]);
        text_str(&body, ",\"from_seq\":");
        put_int(&body, option(&w, "--from"));
        text_str(&body, ",\"limit\":");
        put_int(&body, option(&w, "--limit"));
        text_str(&body, "}");
        call("store", "read", &body);
    }
    if (strcmp(argv[0], "lease") != 0)
        return false;
    w.options[0] = (struct option_spec){"--holder", OPT_STR, "harness"};
    w.options[1] = (struct option_spec){"--ttl", OPT_INT, "60"};
    w.options[2] = (struct option_spec){"--token", OPT_INT, NULL};
    w.option_count = 3;
    if (!take_words(argc - 1, argv + 1, &w, 1, 1))
        return false;
    const char *action = w.positional[0];
    const char *token = option(&w, "--token");
    if (strcmp(action, "acquire") == 0) {
        text_str(&body, "{\"holder\":");
        put_argument(&body, "holder", option(&w, "--holder"));
        text_str(&body, ",\"ttl_s\":");
        put_int(&body, option(&w, "--ttl"));
        text_str(&body, "}");
        call("store", "lease.acquire", &body);
    }
    if (strcmp(action, "renew") != 0 && strcmp(action, "release") != 0)
        return false; /* argparse's choices: its message */
    if (token == NULL) {
        struct text m = message_start();
        text_format(&m, "lease %s needs --token (the one acquire gave)", action);
        message_exit(&m, EXIT_USAGE);
    }
    text_str(&body, "{\"token\":");
    put_int(&body, token);
    if (strcmp(action, "renew") == 0) {
        text_str(&body, ",\"ttl_s\":");
        put_int(&body, option(&w, "--ttl"));
        text_str(&body, "}");
        call("store", "lease.renew", &body);
    }
    text_str(&body, "}");
    call("store", "lease.release", &body);
}

static bool inbox(int argc, char **argv) {
    struct words w = {0};
    struct text body = {0};
    if (strcmp(argv[0], "read") == 0) {
        w.options[0] = (struct option_spec){"--after", OPT_INT, "0"};
        w.options[1] = (struct option_spec){"--limit", OPT_INT, "50"};
        w.option_count = 2;
        if (!take_words(argc - 1, argv + 1, &w, 0, 0))
            return false;
        text_str(&body, "{\"after_id\":");
        put_int(&body, option(&w, "--after"));
        text_str(&body, ",\"limit\":");
        put_int(&body, option(&w, "--limit"));
        text_str(&body, "}");
        call("inbox", "inbox.read", &body);
    }
    if (strcmp(argv[0], "ack") == 0) {
        if (!take_words(argc - 1, argv + 1, &w, 1, 1) || !whole_number(w.positional[0]))
            return false;
        text_str(&body, "{\"through_id\":");
        put_int(&body, w.positional[0]);
        text_str(&body, "}");
        call("inbox", "inbox.ack", &body);
    }
    if (strcmp(argv[0], "send") != 0 || !take_words(argc - 1, argv + 1, &w, 2, 2))
        return false;
    text_str(&body, "{\"message\":");
    put_argument(&body, "message", w.positional[1]);
    text_str(&body, ",\"to\":");
    put_argument(&body, "name", w.positional[0]);
    text_str(&body, "}");
    call("inbox", "inbox.send", &body);
}

void bridge_command(int argc, char **argv) {
    if (argc < 4)
        return;
    if (strcmp(argv[2], "store") == 0)
        (void)store(argc - 3, argv + 3);
    else if (strcmp(argv[2], "inbox") == 0)
        (void)inbox(argc - 3, argv + 3);
}

const char *const BRIDGE_USAGE =
    "lnk bridge store append CONVERSATION EVENT... --expected-seq N --token N\n"
    "  lnk bridge store read CONVERSATION [--from N] [--limit N]\n"
    "  lnk bridge store lease acquire|renew|release [--holder NAME] [--ttl S] [--token N]\n"
    "  lnk bridge inbox read [--after ID] [--limit N]\n"
    "  lnk bridge inbox ack ID\n"
    "  lnk bridge inbox send NAME MESSAGE";
