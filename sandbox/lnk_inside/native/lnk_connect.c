/* lnk-connect HOST PORT: ssh's ProxyCommand inside a sandbox. One HTTP CONNECT to the sandbox's
 * proxy (the relay on 127.0.0.1 that HTTP_PROXY names, relay.c), then bytes both ways between
 * ssh (stdin and stdout) and the tunnel, until both directions end.
 *
 * Why C and not Python: the box grants it to every sandbox with a proxy, under any `[commands]`
 * list, and a finite list without an interpreter must still run it. The box never grants an
 * interpreter (it would run any code), and a static program needs no ELF loader or library the
 * list does not grant. Small enough to read whole.
 *
 * It decides nothing: the proxy, outside, judges HOST and PORT (port 22 only where the spec's
 * `[internet]` lists that host with `:22`) and logs the tunnel in the wire's log. It runs as the
 * sandbox's user with the sandbox's rights; what it is given (its arguments, HTTP_PROXY) is the
 * sandbox's own choice, so nothing here is a trust boundary: an odd HOST is refused here only so
 * that the request stays one well-formed line, and the proxy judges the name again.
 *
 * What it does NOT do: check the ssh server's host key (ssh does, against the known_hosts the
 * sandbox can read), reach anything the proxy refuses, or work without a proxy (no HTTP_PROXY
 * of the sandbox's form: it says so and exits 1).
 *
 * Exit status: 2 a usage error (its arguments), 1 no tunnel (no proxy, refused, no answer),
 * 0 after a tunnel that ended.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "write_all.h"

#define MAX_HOST 253              /* DNS limit on a name's text; an IPv6 literal is shorter */
#define MAX_ANSWER 4096           /* the proxy's answer to a CONNECT: a status line, a few headers */
#define MAX_SHOWN 200             /* of a refusal's answer, said on stderr: its status and body */
#define ANSWER_TIMEOUT_MS 60000   /* the proxy answers after its own dial (which it bounds) */
#define BUFFER (64 * 1024)        /* one direction's bytes in flight */
#define PROXY_PREFIX "http://127.0.0.1:" /* HTTP_PROXY as the box sets it (client_proxy_env.py) */

static const char *program = "lnk-connect";

static int usage(const char *why) {
    fprintf(stderr,
            "%s: %s\nusage: %s HOST PORT  (ssh's ProxyCommand: ProxyCommand %s %%h %%p)\n",
            program, why, program, program);
    return 2;
}

/* A host as it may go on the CONNECT line: a name's letters, digits, '-' and '.', or an IPv6
   literal's hex digits, ':' and '.', with or without brackets. */
static bool host_ok(const char *host) {
    size_t length = strlen(host);
    if (length == 0 || length > MAX_HOST + 2)
        return false;
    const char *body = host;
    if (host[0] == '[') {
        if (length < 3 || host[length - 1] != ']')
            return false;
        body = host + 1;
        length -= 2;
    }
    bool colon = false;
    for (size_t i = 0; i < length; i++) {
        char c = body[i];
        bool name_char = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '-' || c == '.';
        if (c == ':')
            colon = true;
        else if (!name_char)
            return false;
    }
    return body == host || colon; /* brackets hold an IPv6 literal only */
}

/* A port: 1 to 65535, decimal digits only (no sign, no spaces, at most five digits). */
static long port_of(const char *text) {
    size_t length = strlen(text);
    if (length == 0 || length > 5)
        return -1;
    long port = 0;
    for (size_t i = 0; i < length; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        port = port * 10 + (text[i] - '0');
    }
    return port >= 1 && port <= 65535 ? port : -1;
}

/* The relay's port from HTTP_PROXY (http://127.0.0.1:PORT, a trailing '/' allowed), or -1. */
static long relay_port(void) {
    const char *proxy = getenv("HTTP_PROXY");
    if (proxy == NULL || strncmp(proxy, PROXY_PREFIX, strlen(PROXY_PREFIX)) != 0)
        return -1;
    char digits[8];
    const char *rest = proxy + strlen(PROXY_PREFIX);
    size_t length = strcspn(rest, "/");
    if (length >= sizeof digits || (rest[length] == '/' && rest[length + 1] != '\0'))
        return -1;
    memcpy(digits, rest, length);
    digits[length] = '\0';
    return port_of(digits);
}

/* The answer's first line and body, printable characters only, at most MAX_SHOWN of each. */
static void say_refusal(const char *target, const char *answer, size_t length) {
    char shown[MAX_SHOWN + 1];
    size_t out = 0;
    const char *end = memmem(answer, length, "\r\n\r\n", 4);
    const char *line_end = memchr(answer, '\r', length);
    if (line_end == NULL)
        line_end = answer + length;
    for (const char *p = answer; p < line_end && out < MAX_SHOWN; p++)
        shown[out++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    shown[out] = '\0';
    char body[MAX_SHOWN + 1];
    size_t used = 0;
    for (const char *p = end ? end + 4 : answer + length; p < answer + length && used < MAX_SHOWN;
         p++)
        if (*p >= 0x20 && *p < 0x7f)
            body[used++] = *p;
    body[used] = '\0';
    fprintf(stderr, "%s: the sandbox's proxy did not open %s: %s%s%s\n", program, target, shown,
            used ? ": " : "", body);
}

/* Send the CONNECT and read the answer's head; true on a 200. Bytes after the head (ssh
   servers speak first) are written to stdout, not lost. */
static bool open_tunnel(int proxy, const char *target) {
    char request[2 * MAX_HOST + 64];
    int length = snprintf(request, sizeof request, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n",
                          target, target);
    if (length < 0 || (size_t)length >= sizeof request || !write_all(proxy, request, (size_t)length))
        return false;
    char answer[MAX_ANSWER + 1];
    size_t have = 0;
    char *end = NULL;
    while (end == NULL && have < MAX_ANSWER) {
        struct pollfd wait = {.fd = proxy, .events = POLLIN};
        int ready = poll(&wait, 1, ANSWER_TIMEOUT_MS);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready == 0) {
            fprintf(stderr, "%s: the sandbox's proxy did not answer for %s in %d s\n", program,
                    target, ANSWER_TIMEOUT_MS / 1000);
            return false;
        }
        ssize_t n = ready < 0 ? -1 : read(proxy, answer + have, MAX_ANSWER - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
        answer[have] = '\0';
        end = memmem(answer, have, "\r\n\r\n", 4);
    }
    if (end == NULL) {
        /* A refusal closes after its body; read what is left of it to say why. */
        if (have > 0)
            say_refusal(target, answer, have);
        else
            fprintf(stderr, "%s: the sandbox's proxy closed without answering for %s\n", program,
                    target);
        return false;
    }
    bool ok = (strncmp(answer, "HTTP/1.1 200", 12) == 0 || strncmp(answer, "HTTP/1.0 200", 12) == 0)
              && (answer[12] == ' ' || answer[12] == '\r');
    if (!ok) {
        say_refusal(target, answer, have);
        return false;
    }
    size_t used = (size_t)(end + 4 - answer);
    return write_all(STDOUT_FILENO, end + 4, have - used);
}

struct direction {
    int source, sink;
    char buffer[BUFFER];
    size_t held, offset;
    bool done;
};

/* The source ended (or failed): pass the end on as a half-close. */
static void end_direction(struct direction *d, int proxy) {
    d->done = true;
    if (d->sink == proxy)
        shutdown(proxy, SHUT_WR);
    else
        close(d->sink);
}

/* One step of a direction poll said is ready: read when it holds nothing, else write. */
static void step(struct direction *d, int proxy) {
    if (d->held == 0) {
        ssize_t n = read(d->source, d->buffer, BUFFER);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            return;
        if (n <= 0) {
            end_direction(d, proxy);
            return;
        }
        d->held = (size_t)n;
        d->offset = 0;
        return;
    }
    ssize_t n = write(d->sink, d->buffer + d->offset, d->held);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        end_direction(d, proxy);
        return;
    }
    d->offset += (size_t)n;
    d->held -= (size_t)n;
}

static void relay(int proxy) {
    static struct direction up, down;
    up = (struct direction){.source = STDIN_FILENO, .sink = proxy};
    down = (struct direction){.source = proxy, .sink = STDOUT_FILENO};
    while (!(up.done && down.done)) {
        struct direction *ways[2] = {&up, &down};
        struct pollfd polls[2];
        for (int i = 0; i < 2; i++) {
            struct direction *d = ways[i];
            bool reading = d->held == 0;
            polls[i] = (struct pollfd){.fd = d->done ? -1 : reading ? d->source : d->sink,
                                       .events = reading ? POLLIN : POLLOUT};
        }
        if (poll(polls, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        for (int i = 0; i < 2; i++)
            if (polls[i].revents != 0)
                step(ways[i], proxy);
    }
}

int main(int argc, char **argv) {
    if (argc != 3)
        return usage("expected two arguments, HOST and PORT");
    if (!host_ok(argv[1]))
        return usage("HOST is not a host name nor an IP address");
    long port = port_of(argv[2]);
    if (port < 0)
        return usage("PORT is not a number from 1 to 65535");
    long proxy_port = relay_port();
    if (proxy_port < 0) {
        fprintf(stderr,
                "%s: HTTP_PROXY is not a sandbox's proxy (http://127.0.0.1:PORT): run it inside "
                "a sandbox that reaches [internet] or [lan]\n",
                program);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a closed peer ends a direction with EPIPE, not the program */
    char target[MAX_HOST + 16];
    bool bare_v6 = strchr(argv[1], ':') != NULL && argv[1][0] != '[';
    snprintf(target, sizeof target, bare_v6 ? "[%s]:%ld" : "%s:%ld", argv[1], port);
    int proxy = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)proxy_port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (proxy < 0 || connect(proxy, (struct sockaddr *)&address, sizeof address) != 0) {
        fprintf(stderr, "%s: cannot reach the sandbox's proxy at 127.0.0.1:%ld: %s\n", program,
                proxy_port, strerror(errno));
        return 1;
    }
    if (!open_tunnel(proxy, target))
        return 1;
    /* Non-blocking from here: a write that poll allowed never waits for all of its bytes. */
    int fds[3] = {STDIN_FILENO, STDOUT_FILENO, proxy};
    for (int i = 0; i < 3; i++)
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
    relay(proxy);
    return 0;
}
