/* lnk-spawn, the launcher: the controller's one program between itself and bwrap.
 *
 * Runs as root. It dies with the controller's launching thread (PR_SET_PDEATHSIG), then starts
 * one child with clone3(CLONE_NEWPID | CLONE_INTO_CGROUP): pid 1 of a fresh pid namespace, born
 * in the sandbox's cgroup (no migration into it afterwards: a write to cgroup.procs takes the
 * kernel's cgroup_threadgroup_rwsem for writing, an RCU grace period). The child sets
 * vm.memfd_noexec=2 for its pid namespace (no memfd can be executed: this closes memfd_create +
 * fexecve around Landlock; bwrap's nested namespace can only make it stricter), takes the
 * terminal with --ctty, drops to the sandbox user (no groups), dies with lnk-spawn from then on,
 * sets no_new_privs and execs PROGRAM (bwrap) with the environment it was given. lnk-spawn waits
 * and exits as the child did: its code, or death by the same signal (no core).
 *
 * Clocks: with --own-clock, the child is born in a time namespace of its own whose CLOCK_BOOTTIME
 * and CLOCK_MONOTONIC start at 0 (offsets written before any process enters it, as they must be),
 * so /proc/uptime and /proc/stat's btime tell the sandbox's age, not when the host booted. The
 * wall clock (CLOCK_REALTIME) is the host's: time namespaces cannot shift it, and nothing should.
 *
 * Limits: each --join DIR is a cgroup v1 group (a hybrid host's pids, memory or cpu hierarchy)
 * lnk-spawn joins before the clone, so its child is born there too (v1 has no CLONE_INTO_CGROUP);
 * each --rlimit NAME=N (nproc, nofile) is set, soft and hard, in the child before the drop to the
 * sandbox user, a floor under the cgroup limits (RLIMIT_NPROC counts the sandbox's fresh uid);
 * --oom-score-adj N (0 to 1000) is the child's OOM score adjustment, written as root: when the
 * host runs out of memory its OOM killer takes a sandbox before the box's services (which run
 * at or below 0). Where root holds CAP_SYS_RESOURCE the kernel also makes it the floor the
 * sandbox cannot go below (oom_score_adj_min); a container's root without it sets no floor,
 * and then the confiner's Landlock ruleset (no write under /proc) is what keeps it.
 *
 * Inherited descriptors are left as they are: the controller passes bwrap's data memfds and
 * status pipe by number. Any failure before the exec prints `lnk-spawn: WHAT: ERROR` and exits
 * 126: nothing of the sandbox ran.
 *
 * Usage: lnk-spawn --parent PID --cgroup DIR --uid UID --gid GID [--ctty] [--own-clock]
 *        [--join DIR]... [--rlimit NAME=N]... [--oom-score-adj N] -- PROGRAM [ARGS...]
 * PID is the controller's: lnk-spawn refuses to start anything once it is not its parent.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_REFUSED 126 /* the shell's "cannot execute": nothing of the sandbox ran */
#define MEMFD_NOEXEC "/proc/sys/vm/memfd_noexec"
#define TIMENS_OFFSETS "/proc/self/timens_offsets"
#define USAGE                                                                                \
    "usage: lnk-spawn --parent PID --cgroup DIR --uid UID --gid GID [--ctty] [--own-clock] " \
    "[--join DIR]... [--rlimit nproc|nofile=N]... [--oom-score-adj 0-1000] -- PROGRAM [ARGS...]"
#define MAX_JOINS 4   /* the v1 hierarchies a sandbox joins: pids, memory, cpu */
#define MAX_RLIMITS 2 /* nproc and nofile */
#define OOM_SCORE_ADJ "/proc/self/oom_score_adj"
#define MAX_OOM_SCORE_ADJ 1000 /* the kernel's OOM_SCORE_ADJ_MAX; below 0 a sandbox is never put */

/* Print `lnk-spawn: WHAT: strerror(errno)` and exit 126. _exit: the child shares no stdio
   buffer to flush (stderr is unbuffered), and no atexit handler of the parent may run twice. */
__attribute__((noreturn)) static void fail(const char *what) {
    fprintf(stderr, "lnk-spawn: %s: %s\n", what, strerror(errno));
    _exit(EXIT_REFUSED);
}

__attribute__((noreturn)) static void usage(const char *why) {
    fprintf(stderr, "lnk-spawn: %s\n%s\n", why, USAGE);
    _exit(EXIT_REFUSED);
}

/* A uid, gid or pid: decimal digits only, not 0 (the sandbox never runs as root), not -1. */
static unsigned parse_id(const char *option, const char *text) {
    size_t length = strlen(text);
    unsigned long value = 0;
    if (length > 0 && length <= 10 && strspn(text, "0123456789") == length)
        value = strtoul(text, NULL, 10);
    if (value == 0 || value >= 0xffffffffUL) {
        fprintf(stderr, "lnk-spawn: %s must be a number from 1 to 4294967294, not '%s'\n%s\n",
                option, text, USAGE);
        _exit(EXIT_REFUSED);
    }
    return (unsigned)value;
}

/* vm.memfd_noexec=2 for the calling process's pid namespace (Linux 6.3): no memfd executes. */
static void forbid_memfd_exec(void) {
    int fd = open(MEMFD_NOEXEC, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open " MEMFD_NOEXEC);
    if (write(fd, "2", 1) != 1)
        fail("cannot write " MEMFD_NOEXEC);
    if (close(fd) != 0)
        fail("cannot close " MEMFD_NOEXEC);
}

/* A time namespace for lnk-spawn's children (unshare(CLONE_NEWTIME) moves only them) whose
   boot and monotonic clocks read about 0 at the sandbox's birth: the offsets are minus this
   moment's whole seconds (the kernel refuses a clock below 0, so never more). */
static void own_clock(void) {
    struct timespec monotonic, boot;
    if (clock_gettime(CLOCK_MONOTONIC, &monotonic) != 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        fail("cannot read the clocks");
    if (unshare(CLONE_NEWTIME) != 0)
        fail("cannot make a time namespace");
    char offsets[96];
    int length = snprintf(offsets, sizeof offsets, "monotonic -%lld 0\nboottime -%lld 0\n",
                          (long long)monotonic.tv_sec, (long long)boot.tv_sec);
    int fd = open(TIMENS_OFFSETS, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open " TIMENS_OFFSETS);
    if (length <= 0 || length >= (int)sizeof offsets || write(fd, offsets, (size_t)length) != length)
        fail("cannot write " TIMENS_OFFSETS);
    if (close(fd) != 0)
        fail("cannot close " TIMENS_OFFSETS);
}

struct limit {
    int resource;
    rlim_t value;
};

/* NAME=N for --rlimit: nproc or nofile, N from 1 to 2^31-1. */
static struct limit parse_rlimit(const char *text) {
    struct limit parsed = {-1, 0};
    const char *number = NULL;
    if (strncmp(text, "nproc=", 6) == 0) {
        parsed.resource = RLIMIT_NPROC;
        number = text + 6;
    } else if (strncmp(text, "nofile=", 7) == 0) {
        parsed.resource = RLIMIT_NOFILE;
        number = text + 7;
    }
    size_t length = number == NULL ? 0 : strlen(number);
    unsigned long value = 0;
    if (length > 0 && length <= 10 && strspn(number, "0123456789") == length)
        value = strtoul(number, NULL, 10);
    if (parsed.resource < 0 || value == 0 || value > 0x7fffffffUL) {
        fprintf(stderr, "lnk-spawn: --rlimit must be nproc=N or nofile=N, not '%s'\n%s\n", text,
                USAGE);
        _exit(EXIT_REFUSED);
    }
    parsed.value = (rlim_t)value;
    return parsed;
}

/* N for --oom-score-adj: 0 to MAX_OOM_SCORE_ADJ, as written to /proc (-1: none asked). */
static int parse_oom_score_adj(const char *text) {
    size_t length = strlen(text);
    if (length == 0 || length > 4 || strspn(text, "0123456789") != length ||
        strtoul(text, NULL, 10) > MAX_OOM_SCORE_ADJ) {
        fprintf(stderr, "lnk-spawn: --oom-score-adj must be 0 to %d, not '%s'\n%s\n",
                MAX_OOM_SCORE_ADJ, text, USAGE);
        _exit(EXIT_REFUSED);
    }
    return (int)strtoul(text, NULL, 10);
}

/* The child's OOM score adjustment, written while it is root (see the header). */
static void set_oom_score_adj(int value) {
    char text[16];
    int length = snprintf(text, sizeof text, "%d", value);
    int fd = open(OOM_SCORE_ADJ, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open " OOM_SCORE_ADJ);
    if (write(fd, text, (size_t)length) != length)
        fail("cannot set the sandbox's OOM score adjustment");
    if (close(fd) != 0)
        fail("cannot close " OOM_SCORE_ADJ);
}

/* Move lnk-spawn into the v1 group DIR ("0" is the writer): its child is born there. */
static void join_group(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        fail("the --join folder's name is too long");
    }
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open a --join group's cgroup.procs");
    if (write(fd, "0", 1) != 1)
        fail("cannot join a --join group");
    if (close(fd) != 0)
        fail("cannot close a --join group's cgroup.procs");
}

/* The child: pid 1 of the new pid namespace, in the sandbox's cgroup since its birth.
   `alive` is the read end of a pipe whose write end only lnk-spawn holds: it hangs up when
   lnk-spawn is gone (getppid() cannot tell: the parent is outside this pid namespace). */
__attribute__((noreturn)) static void child(const sigset_t *mask, int alive, unsigned uid,
                                            unsigned gid, int ctty, const struct limit *limits,
                                            int nlimits, int oom_score_adj, char **argv) {
    if (sigprocmask(SIG_SETMASK, mask, NULL) != 0)
        fail("cannot restore the signal mask");
    for (int k = 0; k < nlimits; k++) {
        struct rlimit both = {limits[k].value, limits[k].value};
        if (setrlimit(limits[k].resource, &both) != 0)
            fail("cannot set an --rlimit");
    }
    if (oom_score_adj >= 0)
        set_oom_score_adj(oom_score_adj);
    forbid_memfd_exec();
    if (ctty && setsid() < 0)
        fail("cannot start a session");
    if (ctty && ioctl(0, TIOCSCTTY, 0) != 0)
        fail("cannot take the terminal on stdin");
    if (setgroups(0, NULL) != 0)
        fail("cannot clear the groups");
    if (setresgid(gid, gid, gid) != 0)
        fail("cannot set the gid");
    if (setresuid(uid, uid, uid) != 0)
        fail("cannot set the uid");
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0)
        fail("cannot read the ids back");
    if (ruid != uid || euid != uid || suid != uid || rgid != gid || egid != gid || sgid != gid ||
        getgroups(0, NULL) != 0) {
        errno = EPERM;
        fail("the ids did not change");
    }
    /* After the drop: a change of credentials clears the parent-death signal. Then the race:
       if lnk-spawn died before the prctl, no signal comes, but the pipe has hung up. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        fail("cannot set the parent-death signal");
    struct pollfd hangup = {.fd = alive, .events = 0, .revents = 0};
    if (poll(&hangup, 1, 0) < 0)
        fail("cannot check that lnk-spawn is alive");
    if (hangup.revents != 0) {
        errno = ESRCH;
        fail("lnk-spawn is gone");
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail("cannot set no_new_privs");
    execv(argv[0], argv);
    fprintf(stderr, "lnk-spawn: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(EXIT_REFUSED);
}

/* Exit as the child did; a child killed by signal N kills lnk-spawn with N, so the controller
   sees -N as before. No core: the dump would be lnk-spawn's, not the sandbox's. */
__attribute__((noreturn)) static void exit_like(int status) {
    if (WIFEXITED(status))
        exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    struct rlimit no_core = {0, 0};
    sigset_t only;
    if (setrlimit(RLIMIT_CORE, &no_core) != 0)
        fail("cannot turn core dumps off");
    if (sig != SIGKILL && signal(sig, SIG_DFL) == SIG_ERR) /* SIGKILL's cannot be set */
        fail("cannot reset the child's signal");
    if (sigemptyset(&only) != 0 || sigaddset(&only, sig) != 0 ||
        sigprocmask(SIG_UNBLOCK, &only, NULL) != 0)
        fail("cannot unblock the child's signal");
    raise(sig);
    exit(128 + sig); /* a signal whose default is not to die: the shell's code for it */
}

int main(int argc, char **argv) {
    /* First, so the controller's death from here on kills lnk-spawn; a death before it (between
       the controller's fork and this line) is caught below: the parent is no longer --parent. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        fail("cannot set the parent-death signal");

    const char *parent_text = NULL, *cgroup = NULL, *uid_text = NULL, *gid_text = NULL;
    const char *joins[MAX_JOINS];
    struct limit limits[MAX_RLIMITS];
    int ctty = 0, clock = 0, i = 1, njoins = 0, nlimits = 0, oom_score_adj = -1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--ctty") == 0)
            ctty = 1;
        else if (strcmp(argv[i], "--own-clock") == 0)
            clock = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--join") == 0 && njoins < MAX_JOINS)
            joins[njoins++] = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--rlimit") == 0 && nlimits < MAX_RLIMITS)
            limits[nlimits++] = parse_rlimit(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--oom-score-adj") == 0)
            oom_score_adj = parse_oom_score_adj(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--parent") == 0)
            parent_text = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--cgroup") == 0)
            cgroup = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--uid") == 0)
            uid_text = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--gid") == 0)
            gid_text = argv[++i];
        else
            usage("unknown or incomplete option");
    }
    if (parent_text == NULL || cgroup == NULL || uid_text == NULL || gid_text == NULL)
        usage("--parent, --cgroup, --uid and --gid are required");
    if (i + 1 >= argc)
        usage("no program after --");
    unsigned uid = parse_id("--uid", uid_text), gid = parse_id("--gid", gid_text);
    if ((unsigned long)getppid() != parse_id("--parent", parent_text)) {
        errno = ESRCH; /* re-parented: the controller died before the prctl above */
        fail("the controller that started lnk-spawn is gone");
    }

    /* Blocked, as unshare --fork does: Ctrl-C or SIGTERM goes to the sandbox's program, and
       lnk-spawn outlives its child to report how it ended. */
    sigset_t blocked, mask;
    if (sigemptyset(&blocked) != 0 || sigaddset(&blocked, SIGINT) != 0 ||
        sigaddset(&blocked, SIGTERM) != 0 || sigprocmask(SIG_BLOCK, &blocked, &mask) != 0)
        fail("cannot block SIGINT and SIGTERM");

    for (int k = 0; k < njoins; k++)
        join_group(joins[k]);
    if (clock)
        own_clock();
    int group = open(cgroup, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (group < 0)
        fail("cannot open the cgroup");
    int alive[2];
    if (pipe2(alive, O_CLOEXEC) != 0)
        fail("cannot make the liveness pipe");
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_NEWPID | CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned)group;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0)
        fail("cannot start the sandbox's first process (clone3)");
    if (pid == 0) {
        if (close(alive[1]) != 0)
            fail("cannot close the liveness pipe");
        child(&mask, alive[0], uid, gid, ctty, limits, nlimits, oom_score_adj, argv + i + 1);
    }
    if (close(group) != 0 || close(alive[0]) != 0) /* alive[1] stays open until lnk-spawn ends */
        fail("cannot close the cgroup or the liveness pipe");
    int status;
    while (waitpid((pid_t)pid, &status, 0) < 0)
        if (errno != EINTR)
            fail("cannot wait for the sandbox's first process");
    exit_like(status);
}
