/* lnk-sandbox, the confiner: the last step inside the sandbox before the target runs.
 *
 * bwrap starts it as the sandbox's user inside the new namespaces (Landlock must come after
 * bwrap: a landlocked process may not mount). It closes every descriptor but stdio, reads the
 * read-only policy the controller bound in, applies Landlock (filesystem read/write per grant,
 * EXECUTE only for granted programs and the ELF loader, TCP ports and IPC scopes where the
 * policy has them), sets no_new_privs, loads the seccomp deny-list (compiled to BPF by the
 * controller with libseccomp: this program only loads it), starts the relays (before the
 * unix-socket block, which they are the one exception to), loads the unix-socket block, and
 * execs the target.
 *
 * Every failure prints what is missing and exits 126 before the target runs: nothing ever runs
 * unconfined, and a policy needing a feature the kernel lacks is refused, never weakened.
 * It is single-threaded until execv (the relay runs in a forked grandchild), so Landlock and
 * seccomp bind the one thread that becomes the target.
 *
 * Usage: lnk-sandbox [--policy FILE] -- PROGRAM [ARGS...]   (--policy: tests only)
 *        lnk-sandbox [--policy FILE] [--argv FILE] [--release-fd N] --
 *                                      (the program's argv from a file; wait to be released)
 *        lnk-sandbox --relay|--relay-handoff SOCKET PORT     (the proxy benchmark)
 *
 * --release-fd N: the read end of a pipe only the controller writes. The confiner confines
 * itself as above, then waits there for the one byte RELEASE_BYTE before it starts the relays
 * and execs the target: the controller makes and seals a write grant's placeholders while bwrap
 * and this program start (staging.py), and releases the target once every one is in place.
 * Anything else (end of file: the controller closed it or died; another byte; an error) refuses,
 * so a launch the controller abandons never runs its program. The descriptor is closed before
 * the relays start and the target runs: neither holds it.
 *
 * The controller gives the program's argv in a file (ARGV_PATH: NUL-terminated arguments,
 * copied by bwrap like the policy), so bwrap's and this program's command lines, which every
 * local user may read in /proc, hold none of it; the program's own command line still does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "relay.h"

#define POLICY_PATH "/run/lnk-confiner/policy"
#define ARGV_PATH "/run/lnk-confiner/argv"
#define MAX_ARGV_BYTES (8 << 20) /* above any argv execve takes (ARG_MAX: a quarter of the stack) */
#define MAX_ARGV_COUNT 65536     /* the controller passes at most 4096 (launch_request.MAX_ARGS) */
#define POLICY_HEADER "lnk-confiner-policy 2" /* the format spawn.encode_policy writes */
#define MAX_POLICY_BYTES (1 << 20)            /* the controller writes a few KiB */
#define MAX_PATHS 4096                        /* grants per kind: far above any spec */
#define MAX_PORTS 1024                        /* ports per kind */
#define MAX_BPF_INSNS 4096                    /* BPF_MAXINSNS: the kernel's limit */
#define EXIT_REFUSED 126                      /* the shell's "cannot execute": nothing ran */
#define EXIT_NOT_FOUND 127                    /* the shell's "command not found" */
#define RELEASE_BYTE 'R' /* spawn.RELEASE: the controller's go; end of file never releases */
#define MAX_RELEASE_FD 1000000 /* above any descriptor number a process holds (fs.nr_open) */

/* Landlock (include/uapi/linux/landlock.h; Debian 12's headers predate ABI 4). The syscall
   numbers are the same on x86_64 and aarch64 (new syscalls share one numbering since 5.1). */
#define SYS_LL_CREATE_RULESET 444
#define SYS_LL_ADD_RULE 445
#define SYS_LL_RESTRICT_SELF 446
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2

#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_REMOVE_DIR (1ULL << 4)
#define FS_REMOVE_FILE (1ULL << 5)
#define FS_MAKE_DIR (1ULL << 7)
#define FS_MAKE_REG (1ULL << 8)
#define FS_MAKE_SYM (1ULL << 12)
#define FS_REFER (1ULL << 13)     /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#define NET_BIND_TCP (1ULL << 0)    /* ABI 4 */
#define NET_CONNECT_TCP (1ULL << 1) /* ABI 4 */
#define SCOPE_ABSTRACT_UNIX (1ULL << 0) /* ABI 6 */
#define SCOPE_SIGNAL (1ULL << 1)        /* ABI 6 */

#define ABI_REFER 2
#define ABI_TRUNCATE 3
#define ABI_NET 4
#define ABI_IOCTL_DEV 5
#define ABI_SCOPES 6
#define ABI_AUDIT 7
/* Landlock logs a denial through audit only before the domain's creator calls execve unless
 * told to keep logging after it: the sandbox's program is exec'd, so without this flag none of
 * its denials would be logged (the controller's denials.py reads them to say what to grant). */
#define RESTRICT_SELF_LOG_NEW_EXEC_ON (1U << 1)

/* Rights Landlock accepts on a rule for a non-directory (others are EINVAL there). */
#define FILE_RIGHTS (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
#define READ_RIGHTS (FS_READ_FILE | FS_READ_DIR)
#define WRITE_RIGHTS                                                                        \
    (READ_RIGHTS | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR |          \
     FS_MAKE_REG | FS_REFER | FS_TRUNCATE)
/* Symbolic links only where the policy says (`symlink` lines: the sandbox's private places),
 * never in a write grant, where the owner's tools would follow them (write_links.py). */
#define SYMLINK_RIGHTS FS_MAKE_SYM
/* execve also opens the file for reading, so an execute grant carries READ_FILE. */
#define EXECUTE_RIGHTS (FS_EXECUTE | FS_READ_FILE)

struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

struct net_port_attr {
    uint64_t allowed_access;
    uint64_t port;
};

struct paths {
    const char *items[MAX_PATHS];
    size_t count;
};

struct ports {
    int present; /* 0: the kind is not restricted at all */
    long items[MAX_PORTS];
    size_t count;
};

struct bpf {
    struct sock_filter insns[MAX_BPF_INSNS];
    size_t count; /* 0: absent */
};

struct policy {
    struct paths read, write, execute, symlink;
    struct ports tcp_connect, tcp_bind, relay_localhost;
    long scope_abstract_unix, scope_signal, block_unix_sockets; /* -1: absent */
    long min_abi, unsafe_pretend_abi, relay_port, bridge_port;  /* -1: absent */
    const char *relay_socket, *bridge_socket;
    struct bpf seccomp, seccomp_unix;
};

static const char *target = "the target"; /* named in every refusal */
static char policy_data[MAX_POLICY_BYTES + 2];
static struct policy policy;

/* Print `lnk-sandbox: not running TARGET: WHAT` and exit 126: the one way out on failure. */
__attribute__((noreturn, format(printf, 1, 2))) static void refuse(const char *fmt, ...) {
    va_list args;
    fprintf(stderr, "lnk-sandbox: not running %s: ", target);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
    exit(EXIT_REFUSED);
}

static const char *errname(int number) {
    const char *name = strerrorname_np(number);
    return name != NULL ? name : "an unknown error";
}

/* -- the policy: "KEY\tVALUE" lines under a header; anything else refuses ------------------ */

static long parse_number(const char *key, const char *text) {
    size_t length = strlen(text);
    if (length == 0 || length > 6 || strspn(text, "0123456789") != length)
        refuse("confiner policy: %s must be a number, not '%s'", key, text);
    return strtol(text, NULL, 10);
}

static void add_path(struct paths *paths, const char *key, const char *value) {
    if (value[0] != '/')
        refuse("confiner policy: %s path '%s' is not absolute", key, value);
    if (paths->count == MAX_PATHS)
        refuse("confiner policy: more than %d %s grants", MAX_PATHS, key);
    paths->items[paths->count++] = value;
}

static void add_port(struct ports *ports, const char *key, const char *value) {
    ports->present = 1;
    if (strcmp(value, "-") == 0 && ports != &policy.relay_localhost)
        return; /* restricted, with no port allowed */
    long port = parse_number(key, value);
    if (port > 65535)
        refuse("confiner policy: %s port %ld is not 0-65535", key, port);
    if (ports->count == MAX_PORTS)
        refuse("confiner policy: more than %d %s ports", MAX_PORTS, key);
    ports->items[ports->count++] = port;
}

static void set_once(long *slot, const char *key, long value) {
    if (*slot != -1)
        refuse("confiner policy: %s appears twice", key);
    *slot = value;
}

static void set_flag(long *slot, const char *key, const char *value) {
    if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
        refuse("confiner policy: %s must be 0 or 1, not '%s'", key, value);
    set_once(slot, key, value[0] == '1');
}

static void set_socket(const char **slot, const char *key, const char *value) {
    if (value[0] != '/')
        refuse("confiner policy: %s '%s' is not absolute", key, value);
    if (*slot != NULL)
        refuse("confiner policy: %s appears twice", key);
    *slot = value;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* A BPF program as lowercase hex, as seccomp_export_bpf wrote it (native byte order). */
static void set_bpf(struct bpf *bpf, const char *key, const char *value) {
    size_t length = strlen(value);
    size_t size = length / 2;
    if (bpf->count != 0)
        refuse("confiner policy: %s appears twice", key);
    if (length == 0 || length % 2 != 0 || size % sizeof(struct sock_filter) != 0 ||
        size / sizeof(struct sock_filter) > MAX_BPF_INSNS)
        refuse("confiner policy: %s is not a BPF program in hex (%zu digits)", key, length);
    unsigned char *out = (unsigned char *)bpf->insns;
    for (size_t i = 0; i < size; i++) {
        int high = hex_digit(value[2 * i]), low = hex_digit(value[2 * i + 1]);
        if (high < 0 || low < 0)
            refuse("confiner policy: %s is not a BPF program in hex", key);
        out[i] = (unsigned char)(high << 4 | low);
    }
    bpf->count = size / sizeof(struct sock_filter);
}

static void parse_line(char *line) {
    char *tab = strchr(line, '\t');
    if (tab == NULL)
        refuse("confiner policy: a line without a value: '%s'", line);
    *tab = '\0';
    const char *key = line, *value = tab + 1;
    if (strcmp(key, "read") == 0)
        add_path(&policy.read, key, value);
    else if (strcmp(key, "write") == 0)
        add_path(&policy.write, key, value);
    else if (strcmp(key, "symlink") == 0)
        add_path(&policy.symlink, key, value);
    else if (strcmp(key, "execute") == 0)
        add_path(&policy.execute, key, value);
    else if (strcmp(key, "tcp_connect") == 0)
        add_port(&policy.tcp_connect, key, value);
    else if (strcmp(key, "tcp_bind") == 0)
        add_port(&policy.tcp_bind, key, value);
    else if (strcmp(key, "relay_localhost") == 0)
        add_port(&policy.relay_localhost, key, value);
    else if (strcmp(key, "scope_abstract_unix") == 0)
        set_flag(&policy.scope_abstract_unix, key, value);
    else if (strcmp(key, "scope_signal") == 0)
        set_flag(&policy.scope_signal, key, value);
    else if (strcmp(key, "block_unix_sockets") == 0)
        set_flag(&policy.block_unix_sockets, key, value);
    else if (strcmp(key, "min_abi") == 0)
        set_once(&policy.min_abi, key, parse_number(key, value));
    else if (strcmp(key, "unsafe_pretend_abi") == 0)
        set_once(&policy.unsafe_pretend_abi, key, parse_number(key, value));
    else if (strcmp(key, "relay_port") == 0)
        set_once(&policy.relay_port, key, parse_number(key, value));
    else if (strcmp(key, "bridge_port") == 0)
        set_once(&policy.bridge_port, key, parse_number(key, value));
    else if (strcmp(key, "relay_socket") == 0)
        set_socket(&policy.relay_socket, key, value);
    else if (strcmp(key, "bridge_socket") == 0)
        set_socket(&policy.bridge_socket, key, value);
    else if (strcmp(key, "seccomp") == 0)
        set_bpf(&policy.seccomp, key, value);
    else if (strcmp(key, "seccomp_unix") == 0)
        set_bpf(&policy.seccomp_unix, key, value);
    else
        refuse("confiner policy: unknown line: '%s\t%.40s'", key, value);
}

static void check_policy(void) {
    static const char *const required[] = {"scope_abstract_unix", "scope_signal",
                                           "block_unix_sockets", "min_abi"};
    const long values[] = {policy.scope_abstract_unix, policy.scope_signal,
                           policy.block_unix_sockets, policy.min_abi};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
        if (values[i] == -1)
            refuse("confiner policy: %s is missing", required[i]);
    if (policy.min_abi < 1)
        refuse("confiner policy: min_abi %ld is below 1", policy.min_abi);
    if (policy.seccomp.count == 0)
        refuse("confiner policy: seccomp (the syscall filter) is missing");
    if (policy.block_unix_sockets == 1 && policy.seccomp_unix.count == 0)
        refuse("confiner policy: seccomp_unix (the unix-socket block) is missing");
    if ((policy.relay_socket == NULL) != (policy.relay_port == -1) ||
        (policy.relay_localhost.present && policy.relay_socket == NULL))
        refuse("confiner policy: relay_socket and relay_port go together");
    if ((policy.bridge_socket == NULL) != (policy.bridge_port == -1))
        refuse("confiner policy: bridge_socket and bridge_port go together");
    long relays[] = {policy.relay_port, policy.bridge_port};
    for (size_t i = 0; i < sizeof(relays) / sizeof(relays[0]); i++)
        if (relays[i] == 0 || relays[i] > 65535)
            refuse("confiner policy: relay port %ld is not 1-65535", relays[i]);
    for (size_t i = 0; i < policy.relay_localhost.count; i++)
        if (policy.relay_localhost.items[i] == 0)
            refuse("confiner policy: relay_localhost port 0 is not 1-65535");
}

static void load_policy(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        refuse("confiner policy: cannot read %s: %s", path, strerror(errno));
    size_t size = 0;
    for (;;) {
        ssize_t n = read(fd, policy_data + size, MAX_POLICY_BYTES + 1 - size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            refuse("confiner policy: cannot read %s: %s", path, strerror(errno));
        if (n == 0 || (size += (size_t)n) > MAX_POLICY_BYTES)
            break;
    }
    close(fd);
    if (size > MAX_POLICY_BYTES)
        refuse("confiner policy: the policy is too large");
    if (memchr(policy_data, '\0', size) != NULL)
        refuse("confiner policy: %s holds a NUL byte", path);
    policy_data[size] = '\0';
    size_t header = strlen(POLICY_HEADER);
    if (size == 0 || policy_data[size - 1] != '\n' || strncmp(policy_data, POLICY_HEADER, header) ||
        policy_data[header] != '\n')
        refuse("confiner policy: %s is not a policy of this version", path);
    memset(&policy, 0, sizeof(policy));
    policy.scope_abstract_unix = policy.scope_signal = policy.block_unix_sockets = -1;
    policy.min_abi = policy.unsafe_pretend_abi = policy.relay_port = policy.bridge_port = -1;
    char *line = policy_data + header + 1;
    while (*line != '\0') {
        char *end = strchr(line, '\n'); /* never NULL: the data ends with '\n' */
        *end = '\0';
        parse_line(line);
        line = end + 1;
    }
    check_policy();
}

/* -- Landlock ------------------------------------------------------------------------------ */

static int probe_abi(void) {
    long version = syscall(SYS_LL_CREATE_RULESET, NULL, 0, LL_CREATE_RULESET_VERSION);
    if (version >= 1)
        return (int)version;
    int err = errno;
    const char *hint = err == ENOSYS       ? "the kernel is built without Landlock"
                       : err == EOPNOTSUPP ? "Landlock is disabled at boot"
                                           : "the kernel refused the version query";
    refuse("Landlock is not available: %s (%s)", errname(err), hint);
}

static uint64_t handled_fs(int abi) {
    uint64_t rights = (1ULL << 13) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
    if (abi >= ABI_REFER)
        rights |= FS_REFER;
    if (abi >= ABI_TRUNCATE)
        rights |= FS_TRUNCATE;
    if (abi >= ABI_IOCTL_DEV)
        rights |= FS_IOCTL_DEV;
    return rights;
}

static void add_path_rules(int ruleset, const struct paths *paths, uint64_t access) {
    for (size_t i = 0; i < paths->count; i++) {
        const char *path = paths->items[i];
        int fd = open(path, O_PATH | O_CLOEXEC);
        if (fd < 0)
            refuse("Landlock: cannot open grant %s: %s", path, errname(errno));
        struct stat info;
        if (fstat(fd, &info) != 0)
            refuse("Landlock: cannot stat grant %s: %s", path, errname(errno));
        struct path_beneath_attr attr = {
            .allowed_access = S_ISDIR(info.st_mode) ? access : access & FILE_RIGHTS,
            .parent_fd = fd,
        };
        if (syscall(SYS_LL_ADD_RULE, ruleset, LL_RULE_PATH_BENEATH, &attr, 0) != 0)
            refuse("Landlock: cannot add the rule for path %s: %s", path, errname(errno));
        close(fd);
    }
}

static void add_port_rules(int ruleset, const struct ports *ports, uint64_t right) {
    for (size_t i = 0; i < ports->count; i++) {
        struct net_port_attr attr = {.allowed_access = right, .port = (uint64_t)ports->items[i]};
        if (syscall(SYS_LL_ADD_RULE, ruleset, LL_RULE_NET_PORT, &attr, 0) != 0)
            refuse("Landlock: cannot add the rule for port %ld: %s", ports->items[i],
                   errname(errno));
    }
}

/* Restrict this process and all it starts; sets no_new_privs (required, and wanted anyway). */
static void apply_landlock(void) {
    int abi = probe_abi();
    if (policy.unsafe_pretend_abi != -1) { /* tests only: it can only narrow */
        if (policy.unsafe_pretend_abi > abi)
            refuse("Landlock: cannot pretend ABI %ld above %d", policy.unsafe_pretend_abi, abi);
        abi = (int)policy.unsafe_pretend_abi;
    }
    if (abi < policy.min_abi)
        refuse("Landlock ABI %d is older than the %ld this box requires", abi, policy.min_abi);
    int scopes = policy.scope_abstract_unix == 1 || policy.scope_signal == 1;
    if ((policy.tcp_connect.present || policy.tcp_bind.present) && abi < ABI_NET)
        refuse("Landlock ABI %d is older than the %d TCP rules need", abi, ABI_NET);
    if (scopes && abi < ABI_SCOPES)
        refuse("Landlock ABI %d is older than the %d abstract unix socket and signal scopes "
               "need",
               abi, ABI_SCOPES);
    uint64_t fs = handled_fs(abi);
    struct ruleset_attr attr = {
        .handled_access_fs = fs,
        .handled_access_net = (policy.tcp_connect.present ? NET_CONNECT_TCP : 0) |
                              (policy.tcp_bind.present ? NET_BIND_TCP : 0),
        .scoped = (policy.scope_abstract_unix == 1 ? SCOPE_ABSTRACT_UNIX : 0) |
                  (policy.scope_signal == 1 ? SCOPE_SIGNAL : 0),
    };
    int ruleset = (int)syscall(SYS_LL_CREATE_RULESET, &attr, sizeof(attr), 0);
    if (ruleset < 0)
        refuse("Landlock: cannot create a ruleset: %s", errname(errno));
    add_path_rules(ruleset, &policy.read, READ_RIGHTS & fs);
    add_path_rules(ruleset, &policy.write, WRITE_RIGHTS & fs);
    add_path_rules(ruleset, &policy.execute, EXECUTE_RIGHTS & fs);
    add_path_rules(ruleset, &policy.symlink, SYMLINK_RIGHTS & fs);
    add_port_rules(ruleset, &policy.tcp_connect, NET_CONNECT_TCP);
    add_port_rules(ruleset, &policy.tcp_bind, NET_BIND_TCP);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        refuse("cannot set no_new_privs: %s", errname(errno));
    unsigned flags = abi >= ABI_AUDIT ? RESTRICT_SELF_LOG_NEW_EXEC_ON : 0;
    if (syscall(SYS_LL_RESTRICT_SELF, ruleset, flags) != 0)
        refuse("Landlock: cannot restrict self: %s", errname(errno));
    close(ruleset);
}

/* -- seccomp, relays, exec ----------------------------------------------------------------- */

static void load_seccomp(const struct bpf *bpf, const char *what) {
    struct sock_fprog prog = {.len = (unsigned short)bpf->count,
                              .filter = (struct sock_filter *)bpf->insns};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
        refuse("seccomp filter: cannot load %s: %s", what, errname(errno));
}

static int listen_on(long port) {
    int fd = relay_listen((int)port);
    if (fd < 0)
        refuse("cannot listen on 127.0.0.1:%ld for the relay: %s", port, errname(errno));
    return fd;
}

/* The proxy on relay_port plus one listener per [localhost] port; an agent's store bridge. */
static void start_relays(void) {
    static int listeners[MAX_PORTS + 1], localhost[MAX_PORTS + 1];
    if (policy.relay_socket != NULL) {
        size_t count = 0;
        listeners[count] = listen_on(policy.relay_port);
        localhost[count++] = 0;
        for (size_t i = 0; i < policy.relay_localhost.count; i++) {
            listeners[count] = listen_on(policy.relay_localhost.items[i]);
            localhost[count++] = (int)policy.relay_localhost.items[i];
        }
        if (relay_start_handing(policy.relay_socket, listeners, localhost, count,
                                RELAY_HANDSHAKE_MS, true) != 0)
            refuse("cannot start the proxy relay: %s", errname(errno));
    }
    if (policy.bridge_socket != NULL) {
        listeners[0] = listen_on(policy.bridge_port);
        localhost[0] = 0;
        if (relay_start(policy.bridge_socket, listeners, localhost, 1, RELAY_HANDSHAKE_MS) != 0)
            refuse("cannot start the store bridge relay: %s", errname(errno));
    }
}

/* Close every descriptor above stdio but `keep` (-1: none). */
static void close_inherited(int keep) {
    unsigned first = 3U, last = ~0U;
    if (keep >= 3) { /* below it, then above it */
        if (keep > 3 && syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U) != 0)
            refuse("cannot close its inherited descriptors: %s", errname(errno));
        first = (unsigned)keep + 1;
    }
    if (syscall(SYS_close_range, first, last, 0U) == 0)
        return;
    long max = sysconf(_SC_OPEN_MAX); /* kernels before 5.9 */
    for (long fd = first; fd < (max > 0 ? max : 1024); fd++)
        close((int)fd);
}

static int parse_release_fd(const char *text) {
    size_t length = strlen(text);
    long fd = -1;
    if (length > 0 && length <= 7 && strspn(text, "0123456789") == length)
        fd = strtol(text, NULL, 10);
    if (fd < 3 || fd > MAX_RELEASE_FD) {
        fprintf(stderr, "lnk-sandbox: --release-fd must be a descriptor number from 3, not '%s'\n",
                text);
        exit(EXIT_REFUSED);
    }
    return (int)fd;
}

/* Wait for the controller's RELEASE_BYTE on `fd`, then close it; anything else refuses. */
static void wait_released(int fd) {
    char byte = 0;
    ssize_t n;
    do
        n = read(fd, &byte, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        refuse("cannot read the controller's release: %s", errname(errno));
    if (n == 0 || byte != RELEASE_BYTE)
        refuse("the controller did not release it (the launch was abandoned)");
    if (close(fd) != 0)
        refuse("cannot close the release descriptor: %s", errname(errno));
}

/* The program's argv from `path`: NUL-terminated arguments, at least one, none empty-named. */
static char **load_argv(const char *path) {
    target = "the program";
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        refuse("cannot read its arguments from %s: %s", path, strerror(errno));
    char *data = malloc(MAX_ARGV_BYTES + 1);
    if (data == NULL)
        refuse("no memory for its arguments");
    size_t size = 0;
    for (;;) {
        ssize_t n = read(fd, data + size, MAX_ARGV_BYTES + 1 - size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            refuse("cannot read its arguments from %s: %s", path, strerror(errno));
        if (n == 0 || (size += (size_t)n) > MAX_ARGV_BYTES)
            break;
    }
    close(fd);
    if (size > MAX_ARGV_BYTES)
        refuse("its arguments in %s are too large", path);
    if (size == 0 || data[size - 1] != '\0' || data[0] == '\0')
        refuse("%s does not hold a program and its arguments", path);
    size_t count = 0;
    for (size_t i = 0; i < size; i++)
        count += data[i] == '\0';
    if (count > MAX_ARGV_COUNT)
        refuse("more than %d arguments in %s", MAX_ARGV_COUNT, path);
    char **out = calloc(count + 1, sizeof(char *));
    if (out == NULL)
        refuse("no memory for its arguments");
    for (size_t i = 0, at = 0; i < count; i++) {
        out[i] = data + at;
        at += strlen(data + at) + 1;
    }
    return out;
}

int main(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "--relay") == 0 || strcmp(argv[1], "--relay-handoff") == 0))
        return relay_main(argc, argv);
    const char *policy_path = POLICY_PATH, *argv_path = ARGV_PATH;
    int first = 1, release_fd = -1;
    if (first + 1 < argc && strcmp(argv[first], "--policy") == 0) { /* tests: inside, bound */
        policy_path = argv[first + 1];
        first += 2;
    }
    if (first + 1 < argc && strcmp(argv[first], "--argv") == 0) { /* tests: inside, bound */
        argv_path = argv[first + 1];
        first += 2;
    }
    if (first + 1 < argc && strcmp(argv[first], "--release-fd") == 0) {
        release_fd = parse_release_fd(argv[first + 1]);
        first += 2;
    }
    if (first >= argc || strcmp(argv[first], "--") != 0) {
        fputs("lnk-sandbox: usage: lnk-sandbox [--policy FILE] [--argv FILE] [--release-fd N] "
              "-- [PROGRAM [ARGS...]]\n",
              stderr);
        return EXIT_REFUSED;
    }
    char **target_argv = first + 1 < argc ? argv + first + 1 : load_argv(argv_path);
    target = target_argv[0];
    close_inherited(release_fd);
    load_policy(policy_path);
    apply_landlock();
    load_seccomp(&policy.seccomp, "the syscall filter");
    if (release_fd >= 0)
        wait_released(release_fd);
    start_relays();
    if (policy.block_unix_sockets == 1)
        load_seccomp(&policy.seccomp_unix, "the unix-socket block");
    execv(target, target_argv);
    int err = errno;
    fprintf(stderr, "lnk-sandbox: cannot run %s: %s\n", target, strerror(err));
    return err == ENOENT ? EXIT_NOT_FOUND : EXIT_REFUSED;
}
