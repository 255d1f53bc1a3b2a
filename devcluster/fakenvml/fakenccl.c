/*
 * fakenccl: a stand-in for NVIDIA's libnccl.so.2 (the nvidia-nccl-cu12/cu13
 * wheel's), driven by the top-level "nccl" object of the fake NVML's spec
 * ($SLURM_EXT_FAKE_NVML).
 *
 * Why: slurm-ext's single-node all-reduce test (slurm_ext.acceptance.gpunccl)
 * calls NCCL through ctypes on buffers and streams of the driver API, which
 * CI has only as the fake libcuda (fakecuda.c).  This library answers the
 * calls that test makes: ncclGetVersion, ncclCommInitAll over the fake's
 * CUDA devices, ncclGroupStart / ncclAllReduce (float, sum) / ncclGroupEnd,
 * ncclCommDestroy, ncclGetErrorString and ncclGetLastError.  The all-reduce
 * really sums the ranks' buffers: the fake libcuda's device pointers are
 * host addresses, and two helpers it exports for this library (found with
 * dlsym, as the real NCCL reaches the driver) say whose memory a buffer is
 * and put the modelled time on a stream, where the test's events see it.
 * Its time follows the spec's bus bandwidth; an error and a wrong sum can
 * be asked for.  README.md here, "The fake NCCL", documents the keys.
 *
 * Not on the library path: build() puts it in a subdirectory, so a process
 * sees NCCL only where SLURM_EXT_NCCL_LIBRARY names it.  One thread drives
 * it, as the test does (a mutex guards the state all the same).
 */
#define _GNU_SOURCE
#include "json.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_API __attribute__((visibility("default")))

#define SPEC_ENV "SLURM_EXT_FAKE_NVML"
#define MAX_RANKS 64
#define MAX_CLIQUES 16
#define CHUNK 65536

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

/* ---- the spec's "nccl" object --------------------------------------------- */

struct settings {
    int version;          /* ncclGetVersion's code */
    double busbw_gbps;    /* the all-reduce's modelled bus bandwidth */
    int error;            /* an ncclResult_t to answer, 0: none */
    int error_at_init;    /* 1: ncclCommInitAll answers it; 0: ncclGroupEnd (the all-reduce) */
    int wrong_sum;        /* 1: the sum leaves out the last rank's buffer */
};

/* ---- the model ------------------------------------------------------------- */

struct clique;

struct ncclComm {
    int rank, device;
    struct clique *clique;
    /* the all-reduce enqueued in the open group */
    int pending;
    const float *send;
    float *recv;
    size_t count;
    void *stream;
};

struct clique {
    int n, live;
    struct ncclComm *comms[MAX_RANKS];
};

typedef int (*owner_fn)(unsigned long long ptr, unsigned long long bytes);
typedef int (*spend_fn)(int gpu, void *stream, double ms);
typedef int (*count_fn)(int *count);
typedef int (*init_fn)(unsigned flags);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct settings settings;
static int settings_read;
static struct clique *cliques[MAX_CLIQUES];
static int group_depth;
static char last_error[512];
static owner_fn cuda_owner;
static spend_fn cuda_spend;
static count_fn cuda_count;
static init_fn cuda_init;

static ncclResult_t fail(ncclResult_t rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return rc;
}

static double num(const json_value *obj, const char *key, double fallback)
{
    const json_value *v = json_get(obj, key);
    if (!v)
        return fallback;
    if (v->type == JSON_BOOL)
        return v->boolean;
    return v->type == JSON_NUMBER ? v->d : fallback;
}

/* The spec's "nccl" object over the defaults, once a process.  No spec, or
 * no "nccl" in it: a healthy 8-GPU HGX H200. */
static void read_settings(void)
{
    const char *path = getenv(SPEC_ENV);
    const json_value *nccl, *at;
    json_value root;
    json_error jerr;
    char *text = NULL;
    size_t len = 0;
    FILE *f;
    long size;

    if (settings_read)
        return;
    settings_read = 1;
    /* 2.32.3: the nvidia-nccl-cu12 wheel's version on PyPI as of 2026-12 (NCCL_VERSION_CODE form) */
    settings.version = 23203;
    /* AzNHC's README table gives 480 GB/s for 8 H200s (its configs gate at 431): a healthy node, not a recording */
    settings.busbw_gbps = 480.0;
    settings.error_at_init = 1;
    if (!path || !*path || !(f = fopen(path, "rb")))
        return;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)size + 1)) != NULL) {
        len = fread(text, 1, (size_t)size, f);
        text[len] = 0;
    }
    fclose(f);
    if (!text)
        return;
    if (json_parse(text, len, &root, &jerr) < 0) {
        fprintf(stderr, "fakenccl: %s:%u:%u: %s\n", path, jerr.line, jerr.column, jerr.message);
        free(text);
        return;
    }
    free(text);
    nccl = json_get(&root, "nccl");
    if (nccl && nccl->type == JSON_OBJECT) {
        settings.version = (int)num(nccl, "version", settings.version);
        settings.busbw_gbps = num(nccl, "busbw_gbps", settings.busbw_gbps);
        settings.error = (int)num(nccl, "error", 0);
        settings.wrong_sum = num(nccl, "wrong_sum", 0) != 0;
        at = json_get(nccl, "error_at");
        if (at && at->type == JSON_STRING)
            settings.error_at_init = strcmp(at->str, "allreduce") != 0;
    }
    json_free(&root);
}

/* The driver's library, as the real NCCL finds it: the fake libcuda's
 * helpers, or an error that says a real libcuda cannot drive this fake. */
static ncclResult_t open_cuda(void)
{
    void *lib;
    if (cuda_owner)
        return ncclSuccess;
    if (!(lib = dlopen("libcuda.so.1", RTLD_NOW)))
        return fail(ncclUnhandledCudaError, "fake NCCL: cannot load libcuda.so.1: %s", dlerror());
    cuda_owner = (owner_fn)dlsym(lib, "fakecuda_owner");
    cuda_spend = (spend_fn)dlsym(lib, "fakecuda_spend");
    cuda_count = (count_fn)dlsym(lib, "cuDeviceGetCount");
    cuda_init = (init_fn)dlsym(lib, "cuInit");
    if (!cuda_owner || !cuda_spend || !cuda_count || !cuda_init) {
        cuda_owner = NULL;
        return fail(ncclUnhandledCudaError, "fake NCCL: the libcuda.so.1 loaded is not the fake one (fakecuda.c)");
    }
    return ncclSuccess;
}

/* ---- the calls ----------------------------------------------------------- */

NCCL_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    pthread_mutex_lock(&lock);
    read_settings();
    *version = settings.version;
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}

NCCL_API const char *ncclGetErrorString(ncclResult_t code)
{
    /* NCCL's own words (src/init.cc, ncclGetErrorString) */
    switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

NCCL_API const char *ncclGetLastError(struct ncclComm *comm)
{
    (void)comm;
    return last_error;
}

static ncclResult_t init_all(struct ncclComm **comms, int ndev, const int *devlist)
{
    struct clique *c;
    int count = 0, slot;
    ncclResult_t rc;

    if (!comms || ndev < 1 || ndev > MAX_RANKS)
        return fail(ncclInvalidArgument, "ncclCommInitAll: %d devices", ndev);
    read_settings();
    if ((rc = open_cuda()) != ncclSuccess)
        return rc;
    if (cuda_count(&count) != 0 && (cuda_init(0) != 0 || cuda_count(&count) != 0))
        return fail(ncclUnhandledCudaError, "fake NCCL: the fake libcuda sees no GPU");
    if (settings.error && settings.error_at_init)
        return fail(settings.error, "fake NCCL: the spec's nccl.error (%d) at init", settings.error);
    for (int r = 0; r < ndev; r++) {
        int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= count)
            return fail(ncclInvalidArgument, "ncclCommInitAll: CUDA device %d of %d", d, count);
        for (int q = 0; q < r; q++)
            if ((devlist ? devlist[q] : q) == d)
                return fail(ncclInvalidUsage, "Duplicate GPU detected: rank %d and rank %d both on CUDA device %d",
                            q, r, d);
    }
    for (slot = 0; slot < MAX_CLIQUES && cliques[slot]; slot++) {
    }
    if (slot == MAX_CLIQUES || !(c = calloc(1, sizeof(*c))))
        return fail(ncclSystemError, "fake NCCL: too many communicators");
    c->n = c->live = ndev;
    for (int r = 0; r < ndev; r++) {
        struct ncclComm *m = calloc(1, sizeof(*m));
        if (!m) {
            for (int q = 0; q < r; q++)
                free(c->comms[q]);
            free(c);
            return fail(ncclSystemError, "fake NCCL: out of memory");
        }
        m->rank = r;
        m->device = devlist ? devlist[r] : r;
        m->clique = c;
        c->comms[r] = m;
    }
    cliques[slot] = c;
    for (int r = 0; r < ndev; r++)
        comms[r] = c->comms[r];
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitAll(struct ncclComm **comms, int ndev, const int *devlist)
{
    pthread_mutex_lock(&lock);
    ncclResult_t rc = init_all(comms, ndev, devlist);
    pthread_mutex_unlock(&lock);
    return rc;
}

NCCL_API ncclResult_t ncclCommDestroy(struct ncclComm *comm)
{
    if (!comm)
        return ncclSuccess;   /* as NCCL: destroying NULL is a no-op */
    pthread_mutex_lock(&lock);
    struct clique *c = comm->clique;
    c->comms[comm->rank] = NULL;
    free(comm);
    if (--c->live == 0) {
        for (int k = 0; k < MAX_CLIQUES; k++)
            if (cliques[k] == c)
                cliques[k] = NULL;
        free(c);
    }
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupStart(void)
{
    pthread_mutex_lock(&lock);
    group_depth++;
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}

/* One clique's all-reduce, every rank's op enqueued: the sum into every
 * rank's receive buffer (chunk by chunk, so that in place works too), then
 * each rank's stream busy for the modelled time. */
static ncclResult_t run_clique(struct clique *c)
{
    size_t count = c->comms[0]->count;
    int summed = settings.wrong_sum && c->n > 1 ? c->n - 1 : c->n;
    float *part = malloc(CHUNK * sizeof(float));
    double n = c->n, algbw, ms;
    ncclResult_t rc = ncclSuccess;

    for (int r = 0; r < c->n; r++) {
        struct ncclComm *m = c->comms[r];
        if (!m || !m->pending)
            rc = fail(ncclInvalidUsage, "fake NCCL: rank %d has no all-reduce in the group (all %d ranks must "
                      "take part, or the real NCCL hangs)", r, c->n);
        else if (m->count != count)
            rc = fail(ncclInvalidUsage, "fake NCCL: rank %d reduces %zu elements, rank 0 %zu", r, m->count, count);
    }
    if (rc == ncclSuccess && settings.error && !settings.error_at_init)
        rc = fail(settings.error, "fake NCCL: the spec's nccl.error (%d) in the all-reduce", settings.error);
    if (rc == ncclSuccess && !part)
        rc = fail(ncclSystemError, "fake NCCL: out of memory");
    for (size_t at = 0; rc == ncclSuccess && at < count; at += CHUNK) {
        size_t len = count - at < CHUNK ? count - at : CHUNK;
        memset(part, 0, len * sizeof(float));
        for (int r = 0; r < summed; r++)
            for (size_t k = 0; k < len; k++)
                part[k] += c->comms[r]->send[at + k];
        for (int r = 0; r < c->n; r++)
            memcpy(c->comms[r]->recv + at, part, len * sizeof(float));
    }
    free(part);
    /* nccl-tests' doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n, so algbw = busbw x n / 2(n-1) */
    algbw = c->n > 1 ? settings.busbw_gbps * n / (2.0 * (n - 1)) : settings.busbw_gbps;
    ms = algbw > 0 ? count * sizeof(float) / (algbw * 1e9) * 1e3 : 0;
    for (int r = 0; rc == ncclSuccess && r < c->n; r++) {
        int cu = cuda_spend(c->comms[r]->device, c->comms[r]->stream, ms);
        if (cu != 0)
            rc = fail(ncclUnhandledCudaError, "fake NCCL: CUDA error %d on rank %d's stream (device %d)", cu, r,
                      c->comms[r]->device);
    }
    for (int r = 0; r < c->n; r++)
        if (c->comms[r])
            c->comms[r]->pending = 0;
    return rc;
}

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    ncclResult_t rc = ncclSuccess, one;
    pthread_mutex_lock(&lock);
    if (group_depth == 0) {
        rc = fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call");
    } else if (--group_depth == 0) {
        for (int k = 0; k < MAX_CLIQUES; k++) {
            struct clique *c = cliques[k];
            int any = 0;
            for (int r = 0; c && r < c->n; r++)
                any |= c->comms[r] && c->comms[r]->pending;
            if (any && (one = run_clique(c)) != ncclSuccess && rc == ncclSuccess)
                rc = one;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

NCCL_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                                    struct ncclComm *comm, void *stream)
{
    ncclResult_t rc = ncclSuccess;
    unsigned long long bytes = count * sizeof(float);
    pthread_mutex_lock(&lock);
    if (!comm)
        rc = fail(ncclInvalidArgument, "ncclAllReduce: comm is NULL");
    else if (datatype != NCCL_FLOAT32 || op != NCCL_SUM)
        rc = fail(ncclInvalidArgument, "fake NCCL: only float sums are modelled (datatype %d, op %d)", datatype, op);
    else if (count == 0 || cuda_owner((unsigned long long)(size_t)send, bytes) != comm->device ||
             cuda_owner((unsigned long long)(size_t)recv, bytes) != comm->device)
        rc = fail(ncclInvalidArgument, "ncclAllReduce: rank %d's buffers are not %zu floats of CUDA device %d",
                  comm->rank, count, comm->device);
    else if (comm->pending)
        rc = fail(ncclInvalidUsage, "fake NCCL: a second all-reduce of rank %d in one group", comm->rank);
    else if (group_depth == 0 && comm->clique->n > 1)
        rc = fail(ncclInvalidUsage, "fake NCCL: an all-reduce of %d ranks from one thread outside a group "
                  "(the real NCCL hangs)", comm->clique->n);
    if (rc == ncclSuccess) {
        comm->pending = 1;
        comm->send = send;
        comm->recv = recv;
        comm->count = count;
        comm->stream = stream;
        if (group_depth == 0)
            rc = run_clique(comm->clique);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
