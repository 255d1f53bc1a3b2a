/*
 * fakecuda: a stand-in for the NVIDIA driver's libcuda.so.1, driven by the
 * same JSON spec as the fake NVML ($SLURM_EXT_FAKE_NVML).
 *
 * Why: slurm-ext's acceptance tests (slurm_ext.acceptance.gpucuda) call the
 * driver API through ctypes and load hand-written PTX kernels.  CI has no
 * GPU, so this library answers the same calls: it enumerates the spec's GPUs
 * (same PCI bus ids, same device-dir visibility as the fake NVML), keeps each
 * GPU's "device memory" in host memory, runs the project's PTX kernels
 * (recognised by their .entry names: fill, check, burn) in C over that
 * memory, and models copies' and kernels' elapsed time from the spec's
 * bandwidths.  Faults come from each GPU's "cuda" object: stuck bits, slow
 * links, a context that fails, a GPU lost after N ms.  README.md here,
 * "The fake libcuda", documents the keys.
 *
 * The spec is read once, at cuInit: each acceptance test runs in a process
 * of its own.  Work runs synchronously when it is enqueued; a stream only
 * remembers when the modelled GPU would be done (synchronize sleeps until
 * then, at most MAX_SLEEP_S per operation) and its modelled clock, which
 * events record.  One mutex guards all state.
 */
#define _GNU_SOURCE
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CUDA_API __attribute__((visibility("default")))

#define SPEC_ENV "SLURM_EXT_FAKE_NVML"
#define DEV_DIR_ENV "SLURM_EXT_FAKE_NVML_DEV_DIR"
#define MAX_GPUS 64
#define MAX_ALLOCS 4096
#define MAX_STUCK 64
#define MAX_SLEEP_S 2.0
#define ALIGN 512ULL
#define MIB (1024ULL * 1024ULL)

/* ---- CUDA types and the error codes this fake answers ------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_UNKNOWN = 999,
};

static const struct { int code; const char *name, *text; } errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {46, "CUDA_ERROR_DEVICES_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* ---- the model ---------------------------------------------------------- */

struct stuck { unsigned long long offset; unsigned bit, value; };
struct alloc { unsigned long long offset, size; };

struct gpu {
    char name[96];
    unsigned domain, bus, device;
    unsigned minor;
    int lost;                         /* NVML "lost": every call on it fails */
    /* its "cuda" object */
    unsigned long long memory;        /* bytes */
    double h2d_gbps, d2h_gbps, d2d_gbps, p2p_gbps, fp32_tflops;
    int context_error, module_error;
    long long lost_after_ms;          /* -1: never */
    struct stuck stuck[MAX_STUCK];
    size_t n_stuck;
    /* state */
    unsigned char *mem;               /* NULL until its context exists */
    struct alloc allocs[MAX_ALLOCS];
    size_t n_allocs;
    double context_at;                /* monotonic seconds */
    int retained;
    int peers[MAX_GPUS];
    double busy_until;                /* monotonic seconds: work queued on it runs until then */
};

struct stream { int gpu; double t_ms, busy_until; };
struct event { double t_ms, wall; int recorded; };
struct context { int gpu; struct stream null_stream; };
struct module { int gpu; int has[3]; };
struct function { int kind; int gpu; };

enum { K_FILL, K_CHECK, K_BURN };
static const char *const kernel_names[] = {"fill", "check", "burn"};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static int driver_version = 13000;
static struct gpu gpus[MAX_GPUS];
static int n_gpus;                     /* visible, in CUDA order */
static struct context contexts[MAX_GPUS];
static struct function functions[MAX_GPUS][3];
static __thread struct context *current;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double when)
{
    double left = when - now();
    if (left <= 0)
        return;
    struct timespec ts = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void say(const char *what)
{
    fprintf(stderr, "fakecuda: %s\n", what);
    fflush(stderr);
}

/* ---- reading the spec --------------------------------------------------- */

static int device_usable(const char *dev_dir, unsigned minor)
{
    char path[PATH_MAX + 32];
    struct stat st;
    int fd;

    snprintf(path, sizeof(path), "%s/nvidia%u", dev_dir, minor);
    if (stat(path, &st) != 0 || !S_ISCHR(st.st_mode))
        return 0;
    fd = open(path, O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno == ENXIO || errno == ENODEV;   /* as the fake NVML: only the driver is missing */
}

static double num(const json_value *obj, const char *key, double fallback)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->d : fallback;
}

static int flag(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && ((v->type == JSON_BOOL && v->boolean) || (v->type == JSON_NUMBER && v->d != 0));
}

/* One spec GPU at NVML position `index` into *g: identity as the fake NVML
 * gives it (spec.c's gpu_defaults), then its "cuda" object. */
static void read_gpu(const json_value *obj, unsigned index, struct gpu *g)
{
    const json_value *v, *cuda, *bits;

    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "NVIDIA H200");
    g->domain = index / 30;
    g->bus = 0x10 + 8 * (index % 30);
    g->minor = index;
    g->memory = 256 * MIB;
    /* the recorded H200 (tests/data/real-gpu, the ctypes prototype): pinned copies best of 5 */
    g->h2d_gbps = 55.4;
    g->d2h_gbps = 55.2;
    g->d2d_gbps = 4265.0;
    g->p2p_gbps = 0.0;                /* the recorded H200 had no NVLink peer */
    g->fp32_tflops = 60.0;
    g->lost_after_ms = -1;
    if (!obj || obj->type != JSON_OBJECT)
        return;
    if ((v = json_get(obj, "name")) && v->type == JSON_STRING)
        snprintf(g->name, sizeof(g->name), "%s", v->str);
    if ((v = json_get(obj, "minor")) && v->type == JSON_NUMBER)
        g->minor = (unsigned)v->d;
    if ((v = json_get(obj, "pci_bus_id")) && v->type == JSON_STRING) {
        unsigned a, b, c, f;
        if (sscanf(v->str, "%x:%x:%x.%x", &a, &b, &c, &f) == 4) {
            g->domain = a, g->bus = b, g->device = c;
        } else if (sscanf(v->str, "%x:%x.%x", &b, &c, &f) == 3) {
            g->domain = 0, g->bus = b, g->device = c;
        }
    }
    g->lost = flag(obj, "lost");
    cuda = json_get(obj, "cuda");
    if (!cuda || cuda->type != JSON_OBJECT)
        return;
    g->memory = (unsigned long long)num(cuda, "memory_mib", 256) * MIB;
    g->h2d_gbps = num(cuda, "h2d_gbps", g->h2d_gbps);
    g->d2h_gbps = num(cuda, "d2h_gbps", g->d2h_gbps);
    g->d2d_gbps = num(cuda, "d2d_gbps", g->d2d_gbps);
    g->p2p_gbps = num(cuda, "p2p_gbps", g->p2p_gbps);
    g->fp32_tflops = num(cuda, "fp32_tflops", g->fp32_tflops);
    g->context_error = (int)num(cuda, "context_error", 0);
    g->module_error = (int)num(cuda, "module_error", 0);
    g->lost_after_ms = (long long)num(cuda, "lost_after_ms", -1);
    if ((bits = json_get(cuda, "stuck_bits")) && bits->type == JSON_ARRAY) {
        for (size_t k = 0; k < bits->count && g->n_stuck < MAX_STUCK; k++) {
            const json_value *s = &bits->items[k];
            struct stuck *st = &g->stuck[g->n_stuck++];
            st->offset = (unsigned long long)num(s, "offset", 0);
            st->bit = (unsigned)num(s, "bit", 0) & 7;
            st->value = num(s, "value", 0) != 0;
        }
    }
}

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long size;

    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)size + 1)) != NULL) {
        *len = fread(text, 1, (size_t)size, f);
        text[*len] = 0;
    }
    fclose(f);
    return text;
}

/* The visible GPUs, in CUDA's order: the reverse of NVML's, so that code
 * taking a CUDA ordinal for an NVML index is caught (the real driver orders
 * by its own heuristic, not by PCI bus id, unless CUDA_DEVICE_ORDER says). */
static CUresult load_spec(void)
{
    const char *path = getenv(SPEC_ENV), *dev_dir = getenv(DEV_DIR_ENV);
    struct gpu nvml_order[MAX_GPUS];
    json_value root;
    json_error jerr;
    const json_value *list, *v;
    size_t len = 0;
    char *text, msg[256];
    int n = 0, count = 0;

    if (!path || !*path) {
        say("$" SPEC_ENV " is not set: no GPUs");
        return CUDA_ERROR_NO_DEVICE;
    }
    if (!(text = read_text(path, &len))) {
        snprintf(msg, sizeof(msg), "cannot read %s: %s", path, strerror(errno));
        say(msg);
        return CUDA_ERROR_NO_DEVICE;
    }
    if (json_parse(text, len, &root, &jerr) < 0) {
        snprintf(msg, sizeof(msg), "%s:%u:%u: %s", path, jerr.line, jerr.column, jerr.message);
        say(msg);
        free(text);
        return CUDA_ERROR_UNKNOWN;
    }
    free(text);
    if ((v = json_get(&root, "init_error")) && v->type != JSON_NULL) {
        json_free(&root);
        return CUDA_ERROR_NO_DEVICE;   /* no driver loaded: no device */
    }
    driver_version = (int)num(&root, "cuda_driver_version", 13000);
    list = json_get(&root, "gpus");
    if (list && list->type == JSON_ARRAY)
        count = (int)list->count;
    else
        count = (int)num(&root, "count", 0);
    for (int k = 0; k < count && n < MAX_GPUS; k++) {
        struct gpu g;
        read_gpu(list && list->type == JSON_ARRAY ? &list->items[k] : NULL, (unsigned)k, &g);
        if (dev_dir && *dev_dir && !device_usable(dev_dir, g.minor))
            continue;
        nvml_order[n++] = g;
    }
    json_free(&root);
    for (int k = 0; k < n; k++)
        gpus[k] = nvml_order[n - 1 - k];
    n_gpus = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

/* ---- helpers every entry point uses ------------------------------------ */

static int gone(const struct gpu *g)
{
    if (g->lost)
        return 1;
    return g->lost_after_ms >= 0 && g->mem && (now() - g->context_at) * 1000.0 >= (double)g->lost_after_ms;
}

/* The GPU of the current context, or an error. */
static CUresult here(struct gpu **g)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *g = &gpus[current->gpu];
    return gone(*g) ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

/* Which GPU's memory holds [ptr, ptr+len)? -1 when none does. */
static int owner(CUdeviceptr ptr, unsigned long long len)
{
    for (int k = 0; k < n_gpus; k++) {
        struct gpu *g = &gpus[k];
        uintptr_t base = (uintptr_t)g->mem;
        if (!g->mem || ptr < base || ptr + len > base + g->memory)
            continue;
        for (size_t a = 0; a < g->n_allocs; a++) {
            unsigned long long lo = base + g->allocs[a].offset;
            if (ptr >= lo && ptr + len <= lo + g->allocs[a].size)
                return k;
        }
    }
    return -1;
}

/* A stuck bit holds its value whatever is written: applied after every write. */
static void apply_stuck(struct gpu *g, CUdeviceptr ptr, unsigned long long len)
{
    unsigned long long first = ptr - (uintptr_t)g->mem;
    for (size_t k = 0; k < g->n_stuck; k++) {
        struct stuck *s = &g->stuck[k];
        if (s->offset < first || s->offset >= first + len || s->offset >= g->memory)
            continue;
        if (s->value)
            g->mem[s->offset] |= (unsigned char)(1u << s->bit);
        else
            g->mem[s->offset] &= (unsigned char)~(1u << s->bit);
    }
}

static struct stream *stream_of(void *handle)
{
    return handle ? (struct stream *)handle : &current->null_stream;
}

/* The work of `ms` modelled milliseconds enqueued on `s`. */
static void spend(struct stream *s, double ms)
{
    double t = now(), wall = ms / 1000.0;
    s->t_ms += ms;
    if (wall > MAX_SLEEP_S)
        wall = MAX_SLEEP_S;
    s->busy_until = (s->busy_until > t ? s->busy_until : t) + wall;
    if (s->busy_until > gpus[s->gpu].busy_until)
        gpus[s->gpu].busy_until = s->busy_until;
}

static double copy_ms(unsigned long long bytes, double gbps)
{
    return gbps > 0 ? bytes / (gbps * 1e9) * 1e3 : 0.0;
}

/* ---- library, devices ---------------------------------------------------- */

CUDA_API CUresult cuInit(unsigned int flags)
{
    CUresult rc = CUDA_SUCCESS;
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!initialised) {
        rc = load_spec();
        initialised = rc == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised) {
        /* callable before cuInit, as the real one: read the spec's version */
        pthread_mutex_lock(&lock);
        if (!initialised && load_spec() == CUDA_SUCCESS)
            initialised = 1;
        pthread_mutex_unlock(&lock);
    }
    *version = driver_version;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceGetCount(int *count)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = n_gpus;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= n_gpus)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult device_ok(CUdevice d)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_gpus)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    CUresult rc = device_ok(d);
    if (rc)
        return rc;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", gpus[d].name);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice d)
{
    CUresult rc = device_ok(d);
    if (rc)
        return rc;
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(bus_id, (size_t)len, "%04X:%02X:%02X.0", gpus[d].domain, gpus[d].bus, gpus[d].device);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    CUresult rc = device_ok(d);
    if (rc)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = gpus[d].memory;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
    CUresult rc = device_ok(d);
    if (rc || (rc = device_ok(peer)))
        return rc;
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    *can = d != peer && gpus[d].p2p_gbps > 0 && gpus[peer].p2p_gbps > 0;
    return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------- */

static CUresult retain(CUdevice d, struct context **out)
{
    struct gpu *g;
    CUresult rc = device_ok(d);
    if (rc)
        return rc;
    g = &gpus[d];
    if (g->context_error)
        return g->context_error;
    if (g->lost)
        return CUDA_ERROR_UNKNOWN;
    if (!g->mem) {
        void *mem = mmap(NULL, g->memory, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->mem = mem;
        g->context_at = now();
        contexts[d].gpu = d;
    }
    g->retained++;
    *out = &contexts[d];
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d)
{
    struct context *c = NULL;
    CUresult rc;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    rc = retain(d, &c);
    pthread_mutex_unlock(&lock);
    if (rc == CUDA_SUCCESS)
        *ctx = c;
    return rc;
}

CUDA_API CUresult cuCtxCreate_v2(void **ctx, unsigned int flags, CUdevice d)
{
    CUresult rc = cuDevicePrimaryCtxRetain(ctx, d);
    (void)flags;
    if (rc == CUDA_SUCCESS)
        current = *ctx;
    return rc;
}

/* The last release frees the GPU's memory, as the real primary context's. */
static CUresult release(CUdevice d)
{
    CUresult rc = device_ok(d);
    struct gpu *g;
    if (rc)
        return rc;
    g = &gpus[d];
    if (g->retained <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--g->retained == 0 && g->mem) {
        munmap(g->mem, g->memory);
        g->mem = NULL;
        g->n_allocs = 0;
        memset(&contexts[d].null_stream, 0, sizeof(contexts[d].null_stream));
        memset(g->peers, 0, sizeof(g->peers));
        if (current == &contexts[d])
            current = NULL;
    }
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult rc = release(d);
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    return cuDevicePrimaryCtxRelease_v2(d);
}

CUDA_API CUresult cuCtxDestroy_v2(void *ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    return cuDevicePrimaryCtxRelease_v2(((struct context *)ctx)->gpu);
}

CUDA_API CUresult cuCtxSetCurrent(void *ctx)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    current = ctx;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuCtxGetCurrent(void **ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuCtxEnablePeerAccess(void *peer_ctx, unsigned int flags)
{
    struct gpu *g;
    CUresult rc;
    int peer;
    (void)flags;
    if (!peer_ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    rc = here(&g);
    peer = ((struct context *)peer_ctx)->gpu;
    if (rc == CUDA_SUCCESS) {
        if (peer == current->gpu || g->p2p_gbps <= 0 || gpus[peer].p2p_gbps <= 0)
            rc = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        else if (g->peers[peer])
            rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        else
            g->peers[peer] = 1;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuCtxSynchronize(void)
{
    struct gpu *g;
    double until;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    until = rc ? 0 : current->null_stream.busy_until;
    pthread_mutex_unlock(&lock);
    sleep_until(until);
    return rc;
}

/* ---- memory ------------------------------------------------------------- */

CUDA_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    struct gpu *g;
    unsigned long long used = 0;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!free_bytes || !total))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        for (size_t k = 0; k < g->n_allocs; k++)
            used += g->allocs[k].size;
        *free_bytes = g->memory - used;
        *total = g->memory;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* First fit over the allocations, kept sorted by offset. */
CUDA_API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes)
{
    struct gpu *g;
    unsigned long long size = (bytes + ALIGN - 1) / ALIGN * ALIGN, at = 0;
    size_t slot;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!ptr || bytes == 0))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        for (slot = 0; slot < g->n_allocs; slot++) {
            if (g->allocs[slot].offset - at >= size)
                break;
            at = g->allocs[slot].offset + g->allocs[slot].size;
        }
        if (at + size > g->memory || g->n_allocs == MAX_ALLOCS) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            memmove(&g->allocs[slot + 1], &g->allocs[slot], (g->n_allocs - slot) * sizeof(struct alloc));
            g->allocs[slot].offset = at;
            g->allocs[slot].size = size;
            g->n_allocs++;
            *ptr = (uintptr_t)g->mem + at;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    struct gpu *g;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS) {
        size_t k;
        rc = CUDA_ERROR_INVALID_VALUE;
        for (k = 0; k < g->n_allocs; k++) {
            if ((uintptr_t)g->mem + g->allocs[k].offset == ptr) {
                memmove(&g->allocs[k], &g->allocs[k + 1], (g->n_allocs - k - 1) * sizeof(struct alloc));
                g->n_allocs--;
                rc = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuMemHostAlloc(void **host, size_t bytes, unsigned int flags)
{
    (void)flags;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *host = mmap(NULL, bytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*host == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(size_t *)*host = bytes + 4096;     /* its length, in the page before what the caller gets */
    *host = (char *)*host + 4096;
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuMemFreeHost(void *host)
{
    if (!host)
        return CUDA_ERROR_INVALID_VALUE;
    char *start = (char *)host - 4096;
    munmap(start, *(size_t *)start);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuMemsetD32_v2(CUdeviceptr ptr, unsigned int value, size_t count)
{
    struct gpu *g;
    double until = 0;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && owner(ptr, count * 4ULL) != current->gpu)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        unsigned int *w = (unsigned int *)(uintptr_t)ptr;
        for (size_t k = 0; k < count; k++)
            w[k] = value;
        apply_stuck(g, ptr, count * 4ULL);
        spend(&current->null_stream, copy_ms(count * 4ULL, g->d2d_gbps));
        until = current->null_stream.busy_until;
    }
    pthread_mutex_unlock(&lock);
    sleep_until(until);
    return rc;
}

CUDA_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *stream)
{
    struct gpu *g;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!src || owner(dst, bytes) != current->gpu))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        memcpy((void *)(uintptr_t)dst, src, bytes);
        apply_stuck(g, dst, bytes);
        spend(stream_of(stream), copy_ms(bytes, g->h2d_gbps));
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *stream)
{
    struct gpu *g;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!dst || owner(src, bytes) != current->gpu))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        memcpy(dst, (const void *)(uintptr_t)src, bytes);
        spend(stream_of(stream), copy_ms(bytes, g->d2h_gbps));
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Device to device: the modelled time counts the bytes read and written. */
CUDA_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *stream)
{
    struct gpu *g;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (owner(dst, bytes) != current->gpu || owner(src, bytes) != current->gpu))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
        apply_stuck(g, dst, bytes);
        spend(stream_of(stream), copy_ms(2ULL * bytes, g->d2d_gbps));
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dst_ctx, CUdeviceptr src, void *src_ctx,
                                    size_t bytes, void *stream)
{
    struct gpu *g;
    int to, from;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!dst_ctx || !src_ctx))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        to = ((struct context *)dst_ctx)->gpu;
        from = ((struct context *)src_ctx)->gpu;
        if (gone(&gpus[to]) || gone(&gpus[from]))
            rc = CUDA_ERROR_UNKNOWN;
        else if (owner(dst, bytes) != to || owner(src, bytes) != from)
            rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (rc == CUDA_SUCCESS) {
        /* without peer access the real driver stages through the host: model that as the slower way */
        int direct = gpus[from].peers[to] || gpus[to].peers[from];
        double gbps = direct ? gpus[from].p2p_gbps : fmin(gpus[from].d2h_gbps, gpus[to].h2d_gbps) / 2;
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
        apply_stuck(&gpus[to], dst, bytes);
        spend(stream_of(stream), copy_ms(bytes, gbps));
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- streams and events -------------------------------------------------- */

CUDA_API CUresult cuStreamCreate(void **stream, unsigned int flags)
{
    struct gpu *g;
    (void)flags;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && !stream)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct stream *s = calloc(1, sizeof(*s));
        if (!s) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            s->gpu = current->gpu;
            *stream = s;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuStreamDestroy_v2(void *stream)
{
    if (!stream)
        return CUDA_ERROR_INVALID_HANDLE;
    free(stream);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuStreamSynchronize(void *stream)
{
    struct gpu *g;
    double until = 0;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS)
        until = stream_of(stream)->busy_until;
    pthread_mutex_unlock(&lock);
    sleep_until(until);
    if (rc == CUDA_SUCCESS && gone(g))
        rc = CUDA_ERROR_UNKNOWN;     /* lost while it ran */
    return rc;
}

CUDA_API CUresult cuEventCreate(void **event, unsigned int flags)
{
    (void)flags;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    *event = calloc(1, sizeof(struct event));
    return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUDA_API CUresult cuEventDestroy_v2(void *event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuEventRecord(void *event, void *stream)
{
    struct gpu *g;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && !event)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        struct event *e = event;
        struct stream *s = stream_of(stream);
        e->t_ms = s->t_ms;
        e->wall = s->busy_until;
        e->recorded = 1;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuEventSynchronize(void *event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    sleep_until(((struct event *)event)->wall);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuEventElapsedTime(float *ms, void *start, void *end)
{
    if (!ms || !start || !end)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!((struct event *)start)->recorded || !((struct event *)end)->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(((struct event *)end)->t_ms - ((struct event *)start)->t_ms);
    return CUDA_SUCCESS;
}

/* ---- for the fake NCCL ------------------------------------------------------ */

/* fakenccl.c (the fake libnccl.so.2) finds these two with dlsym, as the real
 * NCCL reaches the driver: device pointers here are host addresses, so it
 * sums the buffers itself and needs only to know whose memory they are and
 * to put its modelled time on a stream, where events see it. */

/* The CUDA ordinal whose allocations hold [ptr, ptr+bytes), or -1. */
CUDA_API int fakecuda_owner(CUdeviceptr ptr, unsigned long long bytes)
{
    pthread_mutex_lock(&lock);
    int gpu = initialised ? owner(ptr, bytes) : -1;
    pthread_mutex_unlock(&lock);
    return gpu;
}

/* ---- for the fake NVML ------------------------------------------------------- */

/* How long a GPU keeps its load clocks after its last work: a real GPU does not
 * drop to idle between two kernels of a burn. */
#define LOAD_TAIL_S 0.5

/* Whether the GPU at PCI domain:bus:device has work running now (or ended
 * within LOAD_TAIL_S): fakenvml.c finds this with dlsym, in the same process,
 * and answers as the recorded H200 under load (its "load" object) while it
 * has, as the real driver shows a GPU's clocks, power and reasons rise with
 * the work a process gives it. */
CUDA_API int fakecuda_busy(unsigned domain, unsigned bus, unsigned device)
{
    int busy = 0;
    pthread_mutex_lock(&lock);
    double t = now();
    for (int k = 0; initialised && k < n_gpus; k++)
        if (gpus[k].domain == domain && gpus[k].bus == bus && gpus[k].device == device)
            busy = gpus[k].busy_until + LOAD_TAIL_S > t;
    pthread_mutex_unlock(&lock);
    return busy;
}

/* `ms` modelled milliseconds on `stream` (NULL: the GPU's null stream),
 * which must be GPU `gpu`'s; CUDA_ERROR_UNKNOWN when the GPU is lost. */
CUDA_API CUresult fakecuda_spend(int gpu, void *stream, double ms)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!initialised)
        rc = CUDA_ERROR_NOT_INITIALIZED;
    else if (gpu < 0 || gpu >= n_gpus || !gpus[gpu].mem)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (gone(&gpus[gpu]))
        rc = CUDA_ERROR_UNKNOWN;
    else if (stream && ((struct stream *)stream)->gpu != gpu)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else
        spend(stream ? (struct stream *)stream : &contexts[gpu].null_stream, ms);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- modules and the project's kernels ----------------------------------- */

/* The PTX's ".entry <name>(" lines say which of the known kernels it has:
 * the driver would compile them, this fake runs their C twins below. */
CUDA_API CUresult cuModuleLoadData(void **module, const void *image)
{
    struct gpu *g;
    struct module *m;
    const char *text = image;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!module || !image))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && g->module_error)
        rc = g->module_error;
    if (rc == CUDA_SUCCESS && (!strstr(text, ".version") || !strstr(text, ".target")))
        rc = CUDA_ERROR_INVALID_PTX;
    if (rc == CUDA_SUCCESS) {
        if (!(m = calloc(1, sizeof(*m)))) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->gpu = current->gpu;
            for (int k = 0; k < 3; k++) {
                char entry[64];
                snprintf(entry, sizeof(entry), ".entry %s(", kernel_names[k]);
                m->has[k] = strstr(text, entry) != NULL;
            }
            *module = m;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUDA_API CUresult cuModuleLoadDataEx(void **module, const void *image, unsigned int n, void *options,
                                     void **values)
{
    (void)n, (void)options, (void)values;
    return cuModuleLoadData(module, image);
}

CUDA_API CUresult cuModuleUnload(void *module)
{
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    free(module);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuModuleGetFunction(void **function, void *module, const char *name)
{
    struct module *m = module;
    if (!function || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (int k = 0; k < 3; k++) {
        if (m->has[k] && strcmp(name, kernel_names[k]) == 0) {
            functions[m->gpu][k].kind = k;
            functions[m->gpu][k].gpu = m->gpu;
            *function = &functions[m->gpu][k];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* acceptance/ptx.py's expected word: mode 0 pattern ^ index, 1 the word's
 * own address (both halves folded) ^ pattern, 2 walking one, 3 walking zero. */
static uint32_t expected(uint32_t mode, uint32_t pattern, uint64_t index, uint64_t address)
{
    uint32_t one = 1u << (((uint32_t)index + pattern) & 31);
    switch (mode) {
    case 1: return (uint32_t)address ^ (uint32_t)(address >> 32) ^ pattern;
    case 2: return one;
    case 3: return ~one;
    default: return pattern ^ (uint32_t)index;   /* 0, and any other mode, as the PTX */
    }
}

static CUresult run_fill(struct gpu *g, void **p, struct stream *s)
{
    uint64_t buf = *(uint64_t *)p[0], words = *(uint64_t *)p[1];
    uint32_t mode = *(uint32_t *)p[2], pattern = *(uint32_t *)p[3];
    if (owner(buf, words * 4) != current->gpu)
        return CUDA_ERROR_LAUNCH_FAILED;    /* an illegal address ends the context on a real GPU */
    uint32_t *w = (uint32_t *)(uintptr_t)buf;
    for (uint64_t i = 0; i < words; i++)
        w[i] = expected(mode, pattern, i, buf + 4 * i);
    apply_stuck(g, buf, words * 4);
    spend(s, copy_ms(words * 4, g->d2d_gbps / 2));
    return CUDA_SUCCESS;
}

/* result: u64[4] = bad words, lowest and highest bad word index, OR of the differing bits */
static CUresult run_check(struct gpu *g, void **p, struct stream *s)
{
    uint64_t buf = *(uint64_t *)p[0], words = *(uint64_t *)p[1], out = *(uint64_t *)p[4];
    uint32_t mode = *(uint32_t *)p[2], pattern = *(uint32_t *)p[3];
    if (owner(buf, words * 4) != current->gpu || owner(out, 32) != current->gpu)
        return CUDA_ERROR_LAUNCH_FAILED;
    const uint32_t *w = (const uint32_t *)(uintptr_t)buf;
    uint64_t *r = (uint64_t *)(uintptr_t)out;
    for (uint64_t i = 0; i < words; i++) {
        uint32_t diff = w[i] ^ expected(mode, pattern, i, buf + 4 * i);
        if (diff) {
            r[0]++;
            if (i < r[1])
                r[1] = i;
            if (i > r[2])
                r[2] = i;
            r[3] |= diff;
        }
    }
    apply_stuck(g, out, 32);
    spend(s, copy_ms(words * 4, g->d2d_gbps / 2));
    return CUDA_SUCCESS;
}

/* The burn's FMAs run on the first few floats only (the rest is modelled):
 * what is stored is what the GPU would store for those. */
static CUresult run_burn(struct gpu *g, void **p, struct stream *s, unsigned threads)
{
    uint64_t buf = *(uint64_t *)p[0];
    uint32_t n = *(uint32_t *)p[1], iters = *(uint32_t *)p[2];
    if (owner(buf, (uint64_t)n * 4) != current->gpu)
        return CUDA_ERROR_LAUNCH_FAILED;
    float *f = (float *)(uintptr_t)buf;
    uint32_t shown = n < 64 ? n : 64, done = threads < n ? threads : n;
    for (uint32_t k = 0; k < shown && k < done; k++) {
        float x = f[k];
        for (uint32_t i = 0; i < iters; i++)
            for (int j = 0; j < 4; j++)
                x = fmaf(x, 0.99999899f, 0.001f);
        f[k] = x;
    }
    spend(s, (double)done * iters * 8.0 / (g->fp32_tflops * 1e12) * 1e3);
    return CUDA_SUCCESS;
}

CUDA_API CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                                 void **extra)
{
    struct function *f = function;
    struct gpu *g;
    (void)shared, (void)extra;
    pthread_mutex_lock(&lock);
    CUresult rc = here(&g);
    if (rc == CUDA_SUCCESS && (!f || !params || f->gpu != current->gpu))
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && (gx == 0 || bx == 0 || bx * by * bz > 1024))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct stream *s = stream_of(stream);
        if (f->kind == K_FILL)
            rc = run_fill(g, params, s);
        else if (f->kind == K_CHECK)
            rc = run_check(g, params, s);
        else
            rc = run_burn(g, params, s, gx * gy * gz * bx * by * bz);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- error texts ----------------------------------------------------------- */

CUDA_API CUresult cuGetErrorName(CUresult code, const char **name)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < sizeof(errors) / sizeof(errors[0]); k++) {
        if (errors[k].code == code) {
            *name = errors[k].name;
            return CUDA_SUCCESS;
        }
    }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUDA_API CUresult cuGetErrorString(CUresult code, const char **text)
{
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < sizeof(errors) / sizeof(errors[0]); k++) {
        if (errors[k].code == code) {
            *text = errors[k].text;
            return CUDA_SUCCESS;
        }
    }
    *text = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
