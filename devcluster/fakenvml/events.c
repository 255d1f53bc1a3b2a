/*
 * NVML event sets for the fake library.
 *
 * Events are listed in the spec file ("events": [...]); an event is
 * identified by its position in that list.  Each event set remembers which
 * positions it has delivered, so every set sees every matching event exactly
 * once: events already in the file when the set was created, and events
 * appended later while a waiter polls.  This mirrors how a health monitor
 * uses NVML (create a set, register GPUs, loop on nvmlEventSetWait) while
 * letting a test inject an Xid simply by appending to the file.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

/* How often a waiter re-checks the spec file.  Short enough that tests do
 * not notice the latency, long enough to cost nothing measurable. */
#define POLL_INTERVAL_MS 10
/* With inotify on the spec's directory the wait sleeps until the file is
 * replaced (how tests add events), like the driver blocking in the kernel;
 * this caps one sleep, in case a change comes some other way. */
#define NOTIFY_SLICE_MS 250

typedef struct { /* nvmlEventData_t, matches pynvml's c_nvmlEventData_t */
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct { /* the pre-MIG struct written by plain nvmlEventSetWait */
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} fake_event_data_v1_t;

_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(fake_event_data_v1_t) == 24, "v1 event data layout");

struct nvmlEventSet_st {
    struct nvmlEventSet_st *next;
    unsigned long long mask[FAKE_MAX_GPUS]; /* registered types per GPU */
    unsigned char *delivered;               /* per event position */
    size_t delivered_cap;
};

/* All live sets, so that a stale or bogus set pointer is rejected with
 * INVALID_ARGUMENT instead of being dereferenced.  Guarded by the library
 * lock (fake_enter/fake_leave). */
static struct nvmlEventSet_st *g_sets;

static int set_is_live(nvmlEventSet_t set)
{
    for (struct nvmlEventSet_st *s = g_sets; s; s = s->next)
        if (s == set)
            return 1;
    return 0;
}

/* A rewritten file with fewer events means earlier positions were removed;
 * forget deliveries beyond the new end so that events appended there later
 * count as new. */
void fake_events_spec_changed(size_t n_events)
{
    for (struct nvmlEventSet_st *s = g_sets; s; s = s->next)
        if (s->delivered_cap > n_events)
            memset(s->delivered + n_events, 0, s->delivered_cap - n_events);
}

static int ensure_capacity(struct nvmlEventSet_st *s, size_t n)
{
    unsigned char *grown;
    if (n <= s->delivered_cap)
        return 0;
    grown = realloc(s->delivered, n);
    if (!grown)
        return -1;
    memset(grown + s->delivered_cap, 0, n - s->delivered_cap);
    s->delivered = grown;
    s->delivered_cap = n;
    return 0;
}

/* Lock held.  Find the oldest undelivered event this set is registered
 * for, mark it delivered and copy it out. */
static int take_event(struct nvmlEventSet_st *s, struct fake_event *out)
{
    const struct fake_spec *spec = fake_current_spec();

    if (ensure_capacity(s, spec->n_events) < 0)
        return 0; /* out of memory: behave as "nothing yet", retry later */
    for (size_t k = 0; k < spec->n_events; k++) {
        const struct fake_event *ev = &spec->events[k];
        /* A hidden GPU's events wait, as an unregistered GPU's do. */
        if (s->delivered[k] || ev->gpu >= spec->n_gpus || ev->gpu >= FAKE_MAX_GPUS ||
            !fake_gpu_visible(ev->gpu))
            continue;
        if (s->mask[ev->gpu] & ev->type) {
            s->delivered[k] = 1;
            *out = *ev;
            return 1;
        }
    }
    return 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fake_sleep_ms(long long ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ; /* EINTR: keep sleeping the remainder */
}

/* Poll until an event arrives or timeout_ms passes.  The lock is dropped
 * while sleeping so other threads (and nvmlEventSetFree) proceed. */
/* An inotify descriptor that wakes on a change of the spec's directory
 * (the spec is replaced by rename), or -1: then the wait polls every
 * POLL_INTERVAL_MS, as a waiting process would otherwise burn CPU that the
 * real driver, blocked in the kernel, does not. */
static int watch_spec_dir(void)
{
    char copy[PATH_MAX];
    const char *path = fake_spec_path();
    int fd;

    if (!path || !*path || strlen(path) >= sizeof(copy))
        return -1;
    strcpy(copy, path);
    fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0)
        return -1;
    if (inotify_add_watch(fd, dirname(copy), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE | IN_ATTRIB) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void sleep_until_change(int fd, long long ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char buf[4096];

    if (fd < 0) {
        fake_sleep_ms(ms < POLL_INTERVAL_MS ? ms : POLL_INTERVAL_MS);
        return;
    }
    if (poll(&p, 1, (int)(ms < NOTIFY_SLICE_MS ? ms : NOTIFY_SLICE_MS)) > 0)
        while (read(fd, buf, sizeof(buf)) > 0)
            ;
}

static nvmlReturn_t wait_loop(nvmlEventSet_t set, long long deadline, int notify,
                              struct fake_event *out);

static nvmlReturn_t wait_for_event(nvmlEventSet_t set, unsigned timeout_ms,
                                   struct fake_event *out)
{
    long long deadline = now_ms() + timeout_ms;
    int notify = watch_spec_dir();
    nvmlReturn_t result = wait_loop(set, deadline, notify, out);

    if (notify >= 0)
        close(notify);
    return result;
}

static nvmlReturn_t wait_loop(nvmlEventSet_t set, long long deadline, int notify,
                              struct fake_event *out)
{
    for (;;) {
        long long left;
        nvmlReturn_t rc = fake_enter();
        if (rc != NVML_SUCCESS)
            return rc;
        if (!set_is_live(set))
            return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
        if (take_event(set, out))
            return fake_leave(NVML_SUCCESS);
        fake_leave(NVML_SUCCESS);

        left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        sleep_until_change(notify, left);
    }
}

NVML_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    LATENCY(-1);
    struct nvmlEventSet_st *s;
    nvmlReturn_t rc;

    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    s = calloc(1, sizeof(*s));
    if (!s)
        return fake_leave(NVML_ERROR_UNKNOWN);
    s->next = g_sets;
    g_sets = s;
    *set = s;
    return fake_leave(NVML_SUCCESS);
}

/* Registering again adds types (NVML keeps one registration per device and
 * set).  Types the device does not support fail with NOT_SUPPORTED. */
NVML_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    unsigned gi;
    nvmlReturn_t rc = fake_enter_gpu(device, &g, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set_is_live(set))
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~g->supported_events)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    set->mask[gi] |= eventTypes;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    LATENCY(-1);
    struct fake_event ev = {0}; /* set by wait_for_event on success; quiets -Wmaybe-uninitialized */
    nvmlReturn_t rc;

    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = wait_for_event(set, timeoutms, &ev);
    if (rc != NVML_SUCCESS)
        return rc;
    data->device = fake_gpu_handle(ev.gpu);
    data->eventType = ev.type;
    data->eventData = ev.data;
    data->gpuInstanceId = ev.gpu_instance_id;
    data->computeInstanceId = ev.compute_instance_id;
    return NVML_SUCCESS;
}

/* The v1 struct is the v2 one without the MIG instance ids. */
NVML_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, fake_event_data_v1_t *data, unsigned int timeoutms)
{
    LATENCY(-1);
    nvmlEventData_t full;
    nvmlReturn_t rc;

    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = nvmlEventSetWait_v2(set, &full, timeoutms);
    if (rc == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return rc;
}

NVML_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    for (struct nvmlEventSet_st **pp = &g_sets; *pp; pp = &(*pp)->next) {
        if (*pp == set) {
            *pp = set->next;
            free(set->delivered);
            free(set);
            return fake_leave(NVML_SUCCESS);
        }
    }
    return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
}
