/*
 * slurm-ext-hook: the Prolog= and Epilog= program slurmd runs for every job.
 *
 * Why C: slurmd runs the Prolog and the Epilog once per job each, and a
 * Python interpreter costs 15-20 ms to start before it has done anything.
 * This client costs about a millisecond: it hands the job to the node's hook
 * service (warm imports, NVML initialised) over a Unix socket that only root
 * can use, waits for the verdict and exits with it.
 *
 * When no service answers (socket missing, connection refused, the socket
 * served by a process that is not root, or the service dies before its
 * verdict) it executes the Python hook, which does the same work itself:
 * slower, same result.
 *
 * Deadlines: slurmd waits for a Prolog or Epilog forever by default
 * (PrologEpilogTimeout unset), so a service that accepted the job and hangs
 * would hang the job's start or end forever. The client gives the service
 * HOOK_DEADLINE seconds in all, of which at most 10 to take the request:
 *   - not taken in time (the service does not read): the request is
 *     incomplete and the service never acts on it, so the Python hook runs;
 *   - taken but no verdict in time: the service may still be working on the
 *     job. The Prolog exits 1 (slurmd drains the node and requeues the job
 *     held): running the job-start scripts a second time beside the
 *     service's, or starting the job unchecked, is worse than a drained node
 *     and a requeued job. The Epilog runs the Python hook: the job is over,
 *     its cleanup (kill, IPC, GPU check) is idempotent, and the next job must
 *     not find its leftovers.
 * HOOK_DEADLINE must exceed the longest Prolog of a healthy service (its
 * job-start scripts' timeouts added up) and stay under PrologEpilogTimeout
 * where that is set.
 *
 * Protocol: "slurm-ext-hook 2\n<phase>\n" then the environment as NUL-ended
 * entries, then an empty entry (one more NUL: the service refuses a request
 * cut short), then end-of-file; the answer is "<exit code> <message>\n".
 *
 * The client puts its own path in SLURM_EXT_HOOK for the service and the
 * Python hook (any value slurmd passed is replaced): the Epilog runs it again
 * as `slurm-ext-hook signal-uid UID SIGNUM` for its sweep of a user's
 * processes (see signal_uid below).
 *
 * Built by `slurm-ext hooks build` with -DHOOK_SOCKET, -DPROLOG_FALLBACK,
 * -DEPILOG_FALLBACK and -DHOOK_DEADLINE; the phase comes from slurmd's
 * SLURM_SCRIPT_CONTEXT (prolog_slurmd / epilog_slurmd), else from this
 * program's name.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef HOOK_DEADLINE
#define HOOK_DEADLINE 300
#endif
/* Handing a request over takes well under a millisecond; a service that has not read it in 10 s (its own
 * read timeout) is not reading. */
#define HANDOVER_DEADLINE (HOOK_DEADLINE < 10 ? HOOK_DEADLINE : 10)

/* what ask() returns instead of an exit code */
#define NO_VERDICT (-1)  /* the service closed, or answered nothing we understand */
#define NOT_TAKEN (-2)   /* the service did not take the request within HANDOVER_DEADLINE */
#define TOO_LATE (-3)    /* the service took the request but gave no verdict within HOOK_DEADLINE */

extern char **environ;

static long long now_ms(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000LL + now.tv_nsec / 1000000;
}

/* Wait until fd is ready for `events` (or hung up): 1 ready, 0 deadline passed, -1 error. */
static int wait_for(int fd, short events, long long deadline)
{
    for (;;) {
        long long left = deadline - now_ms();
        struct pollfd ready = {.fd = fd, .events = events};
        int n;

        if (left <= 0)
            return 0;
        n = poll(&ready, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* MSG_NOSIGNAL: a service that closes early (refused, crashed) must mean the fallback, not SIGPIPE.
 * 0 sent; -1 with errno, ETIMEDOUT when the deadline passed. */
static int write_all(int fd, const char *data, size_t len, long long deadline)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int ready = wait_for(fd, POLLOUT, deadline);
                if (ready > 0)
                    continue;
                if (ready == 0)
                    errno = ETIMEDOUT;
            }
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static const char *phase_of(const char *argv0)
{
    const char *context = getenv("SLURM_SCRIPT_CONTEXT");
    const char *name = strrchr(argv0, '/');

    /* prolog_slurmctld / epilog_slurmctld (PrologSlurmctld=) are not ours: refuse them below */
    if (context && strcmp(context, "prolog_slurmd") == 0)
        return "prolog";
    if (context && strcmp(context, "epilog_slurmd") == 0)
        return "epilog";
    if (context && *context)
        return NULL;
    name = name ? name + 1 : argv0;
    if (strstr(name, "epilog"))
        return "epilog";
    if (strstr(name, "prolog"))
        return "prolog";
    return NULL;
}

static int fallback(const char *phase, char **argv, const char *why)
{
    const char *program = strcmp(phase, "prolog") == 0 ? PROLOG_FALLBACK : EPILOG_FALLBACK;

    fprintf(stderr, "slurm-ext-hook: %s: %s; running %s itself\n", phase, why, program);
    execv(program, argv);
    fprintf(stderr, "slurm-ext-hook: %s: cannot execute %s: %s\n", phase, program, strerror(errno));
    return 1;
}

/* The verdict deadline passed with the request in the service's hands (see the top of this file). */
static int too_late(const char *phase, char **argv)
{
    char why[128];

    if (strcmp(phase, "prolog") == 0) {
        fprintf(stderr, "slurm-ext-hook: prolog: the hook service at " HOOK_SOCKET " took the job but gave no "
                        "verdict within %d s; exiting 1 rather than start the job unchecked (slurmd drains the "
                        "node and requeues the job): check `slurm-ext hooks serve` on this node\n", HOOK_DEADLINE);
        return 1;
    }
    snprintf(why, sizeof(why), "the hook service took the job but gave no verdict within %d s", HOOK_DEADLINE);
    return fallback(phase, argv, why);
}

/* Only root may serve the socket: anyone else gets neither the job's environment nor a say in its verdict. */
static int served_by_root(int fd, char *why, size_t size)
{
    struct ucred peer;
    socklen_t len = sizeof(peer);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0) {
        snprintf(why, size, "cannot tell who serves " HOOK_SOCKET " (%s)", strerror(errno));
        return 0;
    }
    if (peer.uid != 0) {
        snprintf(why, size, HOOK_SOCKET " is served by uid %u (pid %d), not root: not taking its verdict "
                 "(check who can write to its directory)", (unsigned)peer.uid, (int)peer.pid);
        return 0;
    }
    return 1;
}

/* Header, environment (empty strings left out: an empty entry ends the request), end marker, end-of-file. */
static int send_request(int fd, const char *phase, long long deadline)
{
    char header[64];

    snprintf(header, sizeof(header), "slurm-ext-hook 2\n%s\n", phase);
    if (write_all(fd, header, strlen(header), deadline) < 0)
        return -1;
    for (char **entry = environ; *entry; entry++)
        if (**entry && write_all(fd, *entry, strlen(*entry) + 1, deadline) < 0)
            return -1;
    if (write_all(fd, "", 1, deadline) < 0)
        return -1;
    return shutdown(fd, SHUT_WR);
}

/* Send the request; the verdict's exit code, or NO_VERDICT, NOT_TAKEN or TOO_LATE. */
static int ask(int fd, const char *phase, char *message, size_t size, long long start)
{
    char reply[1024];
    size_t got = 0;
    int code;

    if (send_request(fd, phase, start + HANDOVER_DEADLINE * 1000LL) < 0)
        return errno == ETIMEDOUT ? NOT_TAKEN : NO_VERDICT;
    while (got < sizeof(reply) - 1 && !memchr(reply, '\n', got)) {
        ssize_t n = read(fd, reply + got, sizeof(reply) - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ready = wait_for(fd, POLLIN, start + HOOK_DEADLINE * 1000LL);
            if (ready == 0)
                return TOO_LATE;
            if (ready > 0)
                continue;
        }
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    reply[got] = '\0';
    if (got == 0 || !strchr(reply, '\n') || sscanf(reply, "%d", &code) != 1 || code < 0)
        return NO_VERDICT;
    snprintf(message, size, "%s", strchr(reply, ' ') ? strchr(reply, ' ') + 1 : "");
    message[strcspn(message, "\n")] = '\0';
    return code;
}

/*
 * `slurm-ext-hook signal-uid UID SIGNUM`: kill(-1, SIGNUM) with the credentials of UID, for the Epilog's
 * sweep of a user's processes (signal_uid in procs.py). The kernel signals every process the sender may
 * signal in one pass that no fork outruns; as UID, with no capability left, that is every process whose
 * real or saved uid is UID: never root's, never another user's, never this one (kill(-1) skips the
 * caller). A process of its own, so that the Python caller never takes a user's credentials itself (a
 * thread of the hook service running as the user could be sent a fatal signal by the user); the caller
 * starts it with posix_spawn and a session of its own (kill(-1, SIGCONT) also reaches the sender's session).
 * Exit status: 0 sent, 1 no process to signal (ESRCH), 2 bad arguments, 3 the uid could not be taken,
 * 4 capabilities kept as the uid (SECBIT_NO_SETUID_FIXUP: nothing sent), 5 kill failed.
 */
static int signal_uid(const char *uid_text, const char *signum_text)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3];
    char *end;
    unsigned long uid;
    long signum;

    errno = 0;
    uid = strtoul(uid_text, &end, 10);
    if (errno || !*uid_text || *end || *uid_text == '-' || uid == 0 || uid >= (uid_t)-1) {
        fprintf(stderr, "slurm-ext-hook: signal-uid: %s is not a uid other than root's\n", uid_text);
        return 2;
    }
    errno = 0;
    signum = strtol(signum_text, &end, 10);
    if (errno || !*signum_text || *end || signum < 0 || signum >= NSIG) {
        fprintf(stderr, "slurm-ext-hook: signal-uid: %s is not a signal number\n", signum_text);
        return 2;
    }
    /* groups and gid first, while still root; the gid only has to be none of root's: kill looks at uids */
    if (setgroups(0, NULL) < 0 || setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) < 0 ||
        setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0) {
        fprintf(stderr, "slurm-ext-hook: signal-uid: cannot take uid %lu: %s\n", uid, strerror(errno));
        return 3;
    }
    if (syscall(SYS_capget, &header, caps) < 0 || caps[0].effective || caps[1].effective) {
        fprintf(stderr, "slurm-ext-hook: signal-uid: uid %lu kept capabilities (SECBIT_NO_SETUID_FIXUP?): "
                        "sending nothing, which would reach every process\n", uid);
        return 4;
    }
    if (kill(-1, (int)signum) == 0)
        return 0;
    if (errno == ESRCH)
        return 1;
    fprintf(stderr, "slurm-ext-hook: signal-uid: kill(-1, %ld) as uid %lu: %s\n", signum, uid, strerror(errno));
    return 5;
}

/* SLURM_EXT_HOOK: this program, for the Epilog's signal-uid (see the top of this file). */
static void name_self(void)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (len > 0) {
        self[len] = '\0';
        setenv("SLURM_EXT_HOOK", self, 1);
    } else {
        unsetenv("SLURM_EXT_HOOK");
    }
}

int main(int argc, char **argv)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    const char *phase = phase_of(argc > 0 ? argv[0] : "");
    long long start = now_ms();
    char message[1024], why[512];
    int fd, code;

    if (argc == 4 && strcmp(argv[1], "signal-uid") == 0)
        return signal_uid(argv[2], argv[3]);
    if (!phase) {
        fprintf(stderr, "slurm-ext-hook: neither slurmd's Prolog nor its Epilog (SLURM_SCRIPT_CONTEXT=%s); "
                        "install it as Prolog= and Epilog= in slurm.conf, not PrologSlurmctld=\n",
                getenv("SLURM_SCRIPT_CONTEXT") ? getenv("SLURM_SCRIPT_CONTEXT") : "");
        return 1;
    }
    name_self();
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", HOOK_SOCKET);
    /* non-blocking: a service whose backlog is full must not hold connect() either */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return fallback(phase, argv, "no socket");
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) {
        snprintf(why, sizeof(why), "no hook service at " HOOK_SOCKET " (%s)",
                 errno == EAGAIN ? "it accepts no more connections" : strerror(errno));
        close(fd);
        return fallback(phase, argv, why);
    }
    if (!served_by_root(fd, why, sizeof(why))) {
        close(fd);
        return fallback(phase, argv, why);
    }
    code = ask(fd, phase, message, sizeof(message), start);
    close(fd);
    if (code == TOO_LATE)
        return too_late(phase, argv);
    if (code == NOT_TAKEN) {
        snprintf(why, sizeof(why), "the hook service did not take the job within %d s", HANDOVER_DEADLINE);
        return fallback(phase, argv, why);
    }
    if (code < 0)
        return fallback(phase, argv, "the hook service gave no verdict");
    if (message[0])
        fprintf(stderr, "slurm-ext-hook: %s: %s\n", phase, message);
    return code;
}
