/*
 * slurm-ext-hook: the Prolog= and Epilog= program slurmd runs for every job.
 *
 * Why C: slurmd runs the Prolog and the Epilog once per job each, and a
 * Python interpreter costs 15-20 ms to start before it has done anything.
 * This client costs about a millisecond: it hands the job to the node's hook
 * service (warm imports, NVML initialised) over a Unix socket that only root
 * can use, waits for the verdict and exits with it.
 *
 * When no service answers (socket missing, connection refused, or the
 * service dies before its verdict) it executes the Python hook, which does
 * the same work itself: slower, same result.
 *
 * Protocol: "slurm-ext-hook 1\n<phase>\n" then the environment as NUL-ended
 * entries, then end-of-file; the answer is "<exit code> <message>\n".
 *
 * Built by `slurm-ext hooks build` with -DHOOK_SOCKET, -DPROLOG_FALLBACK and
 * -DEPILOG_FALLBACK; the phase comes from slurmd's SLURM_SCRIPT_CONTEXT
 * (prolog_slurmd / epilog_slurmd), else from this program's name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

/* MSG_NOSIGNAL: a service that closes early (refused, crashed) must mean the fallback, not SIGPIPE. */
static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
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

/* Send the request; the verdict's exit code, or -1 when the service did not give one. */
static int ask(int fd, const char *phase, char *message, size_t size)
{
    char header[64], reply[1024];
    size_t got = 0;
    int code;

    snprintf(header, sizeof(header), "slurm-ext-hook 1\n%s\n", phase);
    if (write_all(fd, header, strlen(header)) < 0)
        return -1;
    for (char **entry = environ; *entry; entry++)
        if (write_all(fd, *entry, strlen(*entry) + 1) < 0)
            return -1;
    if (shutdown(fd, SHUT_WR) < 0)
        return -1;
    while (got < sizeof(reply) - 1) {
        ssize_t n = read(fd, reply + got, sizeof(reply) - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    reply[got] = '\0';
    if (got == 0 || !strchr(reply, '\n') || sscanf(reply, "%d", &code) != 1)
        return -1;
    snprintf(message, size, "%s", strchr(reply, ' ') ? strchr(reply, ' ') + 1 : "");
    message[strcspn(message, "\n")] = '\0';
    return code;
}

int main(int argc, char **argv)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    const char *phase = phase_of(argc > 0 ? argv[0] : "");
    char message[1024];
    int fd, code;

    if (!phase) {
        fprintf(stderr, "slurm-ext-hook: neither slurmd's Prolog nor its Epilog (SLURM_SCRIPT_CONTEXT=%s); "
                        "install it as Prolog= and Epilog= in slurm.conf, not PrologSlurmctld=\n",
                getenv("SLURM_SCRIPT_CONTEXT") ? getenv("SLURM_SCRIPT_CONTEXT") : "");
        return 1;
    }
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", HOOK_SOCKET);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fallback(phase, argv, "no socket");
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0)
        return fallback(phase, argv, "no hook service at " HOOK_SOCKET);
    code = ask(fd, phase, message, sizeof(message));
    close(fd);
    if (code < 0)
        return fallback(phase, argv, "the hook service gave no verdict");
    if (message[0])
        fprintf(stderr, "slurm-ext-hook: %s: %s\n", phase, message);
    return code;
}
