/*
 * fakenvml: a stand-in for libnvidia-ml.so.1 driven by a JSON file.
 *
 * Why: slurm-ext talks to GPUs through the real pynvml package.  To test
 * its behaviour on machines without GPUs (CI, laptops, the local dev
 * cluster) we give pynvml a library with the same name and ABI whose
 * answers come from the file named by $SLURM_EXT_FAKE_NVML.  Tests rewrite
 * that file to inject faults (lost GPUs, Xid events, throttling) while the
 * code under test keeps running.  README.md documents the format.
 *
 * This file holds the library core (init/shutdown, spec reloading, device
 * handles) and the device query entry points; events.c holds event sets.
 *
 * Concurrency model: one process-wide mutex guards all state.  Every entry
 * point takes it, stat()s the spec file and reloads it when it changed,
 * answers from the in-memory model and drops the lock.  nvmlEventSetWait
 * drops the lock between polls so other threads are never blocked by it.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define SPEC_ENV "SLURM_EXT_FAKE_NVML"
/* Where the GPUs' nvidia<minor> device files are.  Set: a GPU is visible
 * only when the process can open its file, as with the real driver (see
 * "Visibility by device file" in README.md).  Unset: every GPU is. */
#define DEV_DIR_ENV "SLURM_EXT_FAKE_NVML_DEV_DIR"

/* ---- NVML structures (layouts from pynvml's ctypes definitions) ------- */

typedef struct { /* nvmlPciInfo_t, used by _v3 and NvLinkRemotePciInfo_v2 */
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { /* pre-9.0 nvmlPciInfo_t, used by GetPciInfo and _v2 */
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved[4];
} fake_pci_info_legacy_t;

typedef struct { /* nvmlPciInfoExt_v1_t */
    unsigned int version, domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int baseClass, subClass;
    char busId[32];
} nvmlPciInfoExt_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct { /* nvmlTemperature_v1_t */
    unsigned int version, sensorType;
    int temperature;
} nvmlTemperature_t;

typedef struct { /* nvmlProcessInfo_v1_t: the unversioned entry points */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} fake_process_info_v1_t;

typedef struct { /* nvmlProcessInfo_v2_t == _v3 layout */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} fake_process_info_v2_t;

typedef union { /* nvmlValue_t */
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct { /* nvmlFieldValue_t */
    unsigned int fieldId, scopeId;
    long long timestamp;   /* microseconds since the epoch */
    long long latencyUsec;
    unsigned int valueType; /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct { /* the unversioned nvmlGpuFabricInfo_t */
    unsigned char clusterUuid[FAKE_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state; /* nvmlGpuFabricState_t */
} nvmlGpuFabricInfo_t;

typedef struct { /* nvmlGpuFabricInfo_v2_t; _v3 adds healthSummary */
    unsigned int version;
    unsigned char clusterUuid[FAKE_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
} fake_fabric_info_v2_t;

typedef struct { /* nvmlGpuFabricInfo_v3_t */
    unsigned int version;
    unsigned char clusterUuid[FAKE_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary; /* nvmlGpuFabricHealthSummary_t */
} fake_fabric_info_v3_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t.value offset");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t layout");
_Static_assert(sizeof(fake_fabric_info_v2_t) == 36, "nvmlGpuFabricInfo_v2_t layout");
_Static_assert(sizeof(fake_fabric_info_v3_t) == 40, "nvmlGpuFabricInfo_v3_t layout");
_Static_assert(offsetof(fake_fabric_info_v3_t, healthMask) ==
               offsetof(fake_fabric_info_v2_t, healthMask), "v2 is a prefix of v3");
_Static_assert(sizeof(fake_pci_info_legacy_t) == 52, "legacy pci layout");
_Static_assert(sizeof(nvmlPciInfoExt_t) == 64, "nvmlPciInfoExt_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(fake_process_info_v1_t) == 16, "process v1 layout");
_Static_assert(sizeof(fake_process_info_v2_t) == 24, "process v2 layout");
/* nvmlDeviceGetCpuAffinity fills unsigned long words; pynvml passes 64-bit
 * c_ulonglong arrays, which is the same thing on LP64 Linux only. */
_Static_assert(sizeof(unsigned long) == 8, "LP64 expected");

/* Versioned structs carry sizeof | (version << 24), per nvml.h. */
#define STRUCT_VERSION(type, ver) ((unsigned)(sizeof(type) | ((ver) << 24)))
#define NVML_MEMORY_V2 STRUCT_VERSION(nvmlMemory_v2_t, 2)       /* 0x02000028 */
#define NVML_PCI_INFO_EXT_V1 STRUCT_VERSION(nvmlPciInfoExt_t, 1) /* 0x01000040 */
#define NVML_TEMPERATURE_V1 STRUCT_VERSION(nvmlTemperature_t, 1) /* 0x0100000C */
#define NVML_GPU_FABRIC_INFO_V2 STRUCT_VERSION(fake_fabric_info_v2_t, 2) /* 0x02000024 */
#define NVML_GPU_FABRIC_INFO_V3 STRUCT_VERSION(fake_fabric_info_v3_t, 3) /* 0x03000028 */

/* Field ids of nvmlDeviceGetFieldValues the fake answers (nvml.h NVML_FI_*). */
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94
#define NVML_FI_DEV_REMAPPED_COR 142
#define NVML_FI_DEV_REMAPPED_UNC 143
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

/* A GPU that has MIG enabled can host this many MIG devices (7 on Hopper). */
#define MIG_MAX_DEVICES_DEFAULT 7

/* ---- global state --------------------------------------------------- */

/* Identity of the spec file as last seen.  A rename() onto the path gives
 * a new inode; mtime/ctime/size catch in-place rewrites. */
struct file_id {
    int exists;
    int stat_errno; /* why stat failed, when !exists */
    dev_t dev;
    ino_t ino;
    off_t size;
    long long mtime_ns, ctime_ns;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;                /* nvmlInit minus nvmlShutdown calls */
static char g_path[PATH_MAX];         /* spec file of this session */

const char *fake_spec_path(void)
{
    return g_path;
}
static struct fake_spec *g_spec;      /* last good spec, NULL before any */
static struct file_id g_seen;         /* file version behind g_spec/errors */
static int g_seen_valid;
static char g_last_error[512];        /* why the newest version was refused */

/* Which GPUs of g_spec this process sees.  NVML indexes are dense over the
 * visible GPUs, in spec order: g_visible[index] is the spec position, and
 * g_nvml_index[position] the index (-1: hidden).  Handles stay positional. */
static char g_dev_dir[PATH_MAX];      /* "": no visibility check */
static unsigned g_visible[FAKE_MAX_GPUS];
static unsigned g_n_visible;
static int g_nvml_index[FAKE_MAX_GPUS];

/* Device handles are addresses inside these static tables; the offset says
 * which GPU (and MIG slot) is meant.  Because the tables never move or get
 * freed, a handle stays safe to use after the spec shrinks or changes: it
 * simply resolves to NVML_ERROR_GPU_IS_LOST, like a GPU that fell off the
 * bus, instead of dangling. */
struct nvmlDevice_st {
    char unused;
};
static struct nvmlDevice_st g_gpu_handles[FAKE_MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[FAKE_MAX_GPUS * FAKE_MAX_MIG];

/* The entry point this thread is in and its selecting argument, set by
 * LATENCY() at its start and taken by the first fake_enter() of the call,
 * which sleeps its time in the spec's "latency" (see fake_enter). */
static __thread const char *t_entry;
static __thread long t_selector;

/* ---- spec file loading ---------------------------------------------- */

static struct file_id file_identity(const char *path)
{
    struct file_id id;
    struct stat st;

    memset(&id, 0, sizeof(id));
    if (stat(path, &st) == 0) {
        id.exists = 1;
        id.dev = st.st_dev;
        id.ino = st.st_ino;
        id.size = st.st_size;
        id.mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        id.ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
    } else {
        id.stat_errno = errno;
    }
    return id;
}

static int same_file(const struct file_id *a, const struct file_id *b)
{
    if (!a->exists || !b->exists)
        return a->exists == b->exists && a->stat_errno == b->stat_errno;
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

static void report_error(void)
{
    fprintf(stderr, "fakenvml: %s: %s; %s\n", g_path, g_last_error,
            g_spec ? "keeping the previous state"
                   : "nvmlInit fails with NVML_ERROR_UNKNOWN");
    fflush(stderr);
}

/* Can this process use the GPU whose device file is <g_dev_dir>/nvidia<minor>?
 * The driver opens it read-write: the devices cgroup (EPERM), the file mode
 * (EACCES) or a missing node (ENOENT, a container given only some GPUs)
 * hide the GPU.  ENXIO/ENODEV mean the node passed every access check and
 * only the kernel driver behind major 195 is missing, which is what the
 * fake stands in for: visible.  Not a character device: hidden, as the
 * driver could not talk to it.  errno is preserved. */
static int device_usable(unsigned minor)
{
    char path[PATH_MAX + 32];
    struct stat st;
    int fd, usable, saved_errno = errno;

    snprintf(path, sizeof(path), "%s/nvidia%u", g_dev_dir, minor);
    if (stat(path, &st) != 0 || !S_ISCHR(st.st_mode)) {
        usable = 0;
    } else {
        fd = open(path, O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            usable = 1;
        } else {
            usable = errno == ENXIO || errno == ENODEV;
        }
    }
    errno = saved_errno;
    return usable;
}

/* Lock held: decide which GPUs of g_spec are visible (see g_visible). */
static void update_visibility_locked(void)
{
    size_t n = g_spec ? g_spec->n_gpus : 0;

    g_n_visible = 0;
    for (size_t k = 0; k < FAKE_MAX_GPUS; k++)
        g_nvml_index[k] = -1;
    for (size_t k = 0; k < n && k < FAKE_MAX_GPUS; k++) {
        if (g_dev_dir[0] && !device_usable(g_spec->gpus[k].minor))
            continue;
        g_nvml_index[k] = (int)g_n_visible;
        g_visible[g_n_visible++] = (unsigned)k;
    }
}

int fake_gpu_visible(unsigned position)
{
    return position < FAKE_MAX_GPUS && g_nvml_index[position] >= 0;
}

static long long monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Reload the spec if the file changed since we last looked (lock held).
 * Each file version is parsed at most once, so a broken file costs one
 * stat per call and one message, not a parse and a message per call.
 * Returns 1 when it printed an error message. */
static int refresh_locked(void)
{
    struct file_id id = file_identity(g_path);
    struct fake_spec *fresh;

    if (g_seen_valid && same_file(&id, &g_seen))
        return 0;
    g_seen = id;
    g_seen_valid = 1;
    if (!id.exists) {
        snprintf(g_last_error, sizeof(g_last_error), "cannot stat the spec file: %s",
                 strerror(id.stat_errno));
        report_error();
        return 1;
    }
    fresh = spec_load(g_path, g_last_error, sizeof(g_last_error));
    if (!fresh) {
        report_error();
        return 1;
    }
    spec_free(g_spec);
    g_spec = fresh;
    g_spec->loaded_ns = monotonic_ns();
    g_last_error[0] = '\0';
    /* The GPUs (and their minors) may have changed: check their files again. */
    update_visibility_locked();
    fake_events_spec_changed(fresh->n_events);
    return 0;
}

/* ---- latency ------------------------------------------------------------ */

static void sleep_us(unsigned us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0)
        ; /* EINTR: keep sleeping the remainder */
}

void fake_latency(const char *name, long selector)
{
    t_entry = name;
    t_selector = selector;
}

/* Lock held, spec current: the time the spec's "latency" gives the entry
 * point this thread is in (0: none), taken once per call. */
static unsigned take_latency_us(void)
{
    const char *name = t_entry;

    t_entry = NULL;
    if (!name || !g_spec || !g_spec->n_latency)
        return 0;
    return spec_latency_us(g_spec, name, t_selector);
}

/* ---- locking and handle resolution ----------------------------------- */

/* A call takes its time in the spec's "latency" here, before it answers and
 * without the lock, as a driver call blocked in the kernel lets other
 * threads go on; the answer reflects the spec as it is after the sleep. */
nvmlReturn_t fake_enter(void)
{
    unsigned us;

    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        t_entry = NULL;
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh_locked();
    if ((us = take_latency_us()) > 0) {
        pthread_mutex_unlock(&g_lock);
        sleep_us(us);
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        refresh_locked();
    }
    return NVML_SUCCESS;
}

nvmlReturn_t fake_leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

const struct fake_spec *fake_current_spec(void)
{
    return g_spec;
}

nvmlDevice_t fake_gpu_handle(unsigned index)
{
    return &g_gpu_handles[index];
}

static nvmlDevice_t mig_handle(unsigned gpu, unsigned mig)
{
    return &g_mig_handles[gpu * FAKE_MAX_MIG + mig];
}

/* Map a handle back to (gpu, mig slot or -1).  Integer comparisons because
 * the pointer may be garbage from the caller and must not be dereferenced. */
static int decode_handle(nvmlDevice_t h, unsigned *gpu, int *mig)
{
    uintptr_t p = (uintptr_t)h;
    uintptr_t g0 = (uintptr_t)g_gpu_handles;
    uintptr_t m0 = (uintptr_t)g_mig_handles;

    if (p >= g0 && p < g0 + sizeof(g_gpu_handles)) {
        *gpu = (unsigned)((p - g0) / sizeof(g_gpu_handles[0]));
        *mig = -1;
        return 0;
    }
    if (p >= m0 && p < m0 + sizeof(g_mig_handles)) {
        size_t slot = (p - m0) / sizeof(g_mig_handles[0]);
        *gpu = (unsigned)(slot / FAKE_MAX_MIG);
        *mig = (int)(slot % FAKE_MAX_MIG);
        return 0;
    }
    return -1;
}

/* Lock held.  Every call on a lost GPU (or on a MIG device of one) fails
 * with GPU_IS_LOST, matching the NVML contract after Xid 79; a GPU with a
 * "query_error" fails the same calls with that code instead (a GPU that
 * needs a reset, or whose driver calls time out). */
static nvmlReturn_t resolve(nvmlDevice_t h, const struct fake_gpu **gpu,
                            const struct fake_mig **mig, unsigned *index)
{
    unsigned gi;
    int mi;
    const struct fake_gpu *g;

    if (decode_handle(h, &gi, &mi) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gi >= g_spec->n_gpus)
        return NVML_ERROR_GPU_IS_LOST;
    g = &g_spec->gpus[gi];
    /* Hidden since the handle was taken (a rewrite moved it to another
     * minor): gone for this process, like a GPU off the bus. */
    if (g->lost || !fake_gpu_visible(gi))
        return NVML_ERROR_GPU_IS_LOST;
    if (g->query_error != NVML_SUCCESS)
        return g->query_error;
    *mig = NULL;
    if (mi >= 0) {
        if (!g->mig_current || (size_t)mi >= g->n_mig)
            return NVML_ERROR_GPU_IS_LOST;
        *mig = &g->mig[mi];
    }
    *gpu = g;
    if (index)
        *index = gi;
    return NVML_SUCCESS;
}

/* Lock held.  How long a call on handle `h` hangs first: the
 * "query_delay_ms" of its GPU (for its MIG handles too), also when the call
 * then fails as lost or with "query_error", as a driver call that blocks
 * and then times out does.  A GPU hidden from this process or gone from
 * the spec answers at once. */
static unsigned query_delay_ms(nvmlDevice_t h)
{
    unsigned gi;
    int mi;

    if (decode_handle(h, &gi, &mi) < 0 || gi >= g_spec->n_gpus || !fake_gpu_visible(gi))
        return 0;
    return g_spec->gpus[gi].query_delay_ms;
}

/* fake_enter + resolve, after the GPU's query delay when `delay` is set.
 * The lock is dropped during the sleep so that other threads' calls (on
 * other GPUs) go on, and the answer reflects the spec as it is when the
 * sleep ends; the delay is not taken again for the new spec. */
static nvmlReturn_t enter_handle(nvmlDevice_t h, const struct fake_gpu **gpu,
                                 const struct fake_mig **mig, unsigned *index, int delay)
{
    unsigned ms;
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (delay && (ms = query_delay_ms(h)) > 0) {
        fake_leave(NVML_SUCCESS);
        fake_sleep_ms(ms);
        rc = fake_enter();
        if (rc != NVML_SUCCESS)
            return rc;
    }
    rc = resolve(h, gpu, mig, index);
    if (rc != NVML_SUCCESS)
        return fake_leave(rc);
    return NVML_SUCCESS;
}

/* Entry for calls that accept both GPU and MIG handles. */
static nvmlReturn_t enter_device(nvmlDevice_t h, const struct fake_gpu **gpu,
                                 const struct fake_mig **mig, unsigned *index)
{
    return enter_handle(h, gpu, mig, index, 1);
}

nvmlReturn_t fake_enter_gpu(nvmlDevice_t h, const struct fake_gpu **gpu,
                            unsigned *index)
{
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_device(h, gpu, &mig, index);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_gpu(nvmlDevice_t h, const struct fake_gpu **gpu)
{
    return fake_enter_gpu(h, gpu, NULL);
}

/* ---- small output helpers ------------------------------------------------ */

/* NVML string getters fail with INSUFFICIENT_SIZE rather than truncating. */
static nvmlReturn_t copy_string(char *dst, unsigned length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* Most getters read one scalar of the GPU model: share the boilerplate by
 * field offset instead of repeating it twenty times. */
static nvmlReturn_t get_uint_field(nvmlDevice_t device, unsigned *out, size_t offset)
{
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    memcpy(out, (const char *)g + offset, sizeof(*out));
    return fake_leave(NVML_SUCCESS);
}

static nvmlReturn_t get_u64_field(nvmlDevice_t device, unsigned long long *out,
                                  size_t offset)
{
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    memcpy(out, (const char *)g + offset, sizeof(*out));
    return fake_leave(NVML_SUCCESS);
}

#define UINT_FIELD(device, out, field) \
    get_uint_field((device), (out), offsetof(struct fake_gpu, field))
#define U64_FIELD(device, out, field) \
    get_u64_field((device), (out), offsetof(struct fake_gpu, field))

static void format_bus_id(const struct fake_pci *p, char *out, size_t cap)
{
    snprintf(out, cap, "%08X:%02X:%02X.%X", p->domain, p->bus, p->device,
             p->function);
}

static void format_bus_id_legacy(const struct fake_pci *p, char *out, size_t cap)
{
    snprintf(out, cap, "%04X:%02X:%02X.%X", p->domain & 0xFFFF, p->bus,
             p->device, p->function);
}

static int same_pci(const struct fake_pci *a, const struct fake_pci *b)
{
    return a->domain == b->domain && a->bus == b->bus && a->device == b->device &&
           a->function == b->function;
}

/* PCI ids of whatever sits at `pci`: a GPU of the spec, or (e.g. an
 * NVSwitch behind an NVLink) unknown, reported as 0. */
static void lookup_pci_ids(const struct fake_pci *pci, unsigned *device_id,
                           unsigned *subsystem_id)
{
    *device_id = *subsystem_id = 0;
    for (size_t k = 0; k < g_spec->n_gpus; k++) {
        if (same_pci(&g_spec->gpus[k].pci, pci)) {
            *device_id = g_spec->gpus[k].pci_device_id;
            *subsystem_id = g_spec->gpus[k].pci_subsystem_id;
            return;
        }
    }
}

static void fill_pci_info(nvmlPciInfo_t *out, const struct fake_pci *pci)
{
    memset(out, 0, sizeof(*out));
    format_bus_id_legacy(pci, out->busIdLegacy, sizeof(out->busIdLegacy));
    format_bus_id(pci, out->busId, sizeof(out->busId));
    out->domain = pci->domain;
    out->bus = pci->bus;
    out->device = pci->device;
    lookup_pci_ids(pci, &out->pciDeviceId, &out->pciSubSystemId);
}

static void fill_pci_info_legacy(fake_pci_info_legacy_t *out, const struct fake_pci *pci)
{
    memset(out, 0, sizeof(*out));
    format_bus_id_legacy(pci, out->busId, sizeof(out->busId));
    out->domain = pci->domain;
    out->bus = pci->bus;
    out->device = pci->device;
    lookup_pci_ids(pci, &out->pciDeviceId, &out->pciSubSystemId);
}

/* ======================================================================
 * Library lifetime
 * ====================================================================== */

static nvmlReturn_t init_library(const char *name)
{
    const char *path = getenv(SPEC_ENV);
    const char *dev_dir = getenv(DEV_DIR_ENV);
    unsigned us;
    int printed;

    pthread_mutex_lock(&g_lock);
    /* The spec path is fixed while any nvmlInit is outstanding so that a
     * live session never swaps to an unrelated file under its handles. */
    if (g_refcount == 0) {
        if (!path || !*path || strlen(path) >= sizeof(g_path)) {
            fprintf(stderr, "fakenvml: $%s is %s; nvmlInit fails with "
                            "NVML_ERROR_UNKNOWN\n",
                    SPEC_ENV, path && *path ? "too long" : "not set");
            fflush(stderr);
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNKNOWN;
        }
        if (dev_dir && strlen(dev_dir) >= sizeof(g_dev_dir)) {
            fprintf(stderr, "fakenvml: $%s is too long; nvmlInit fails with "
                            "NVML_ERROR_UNKNOWN\n", DEV_DIR_ENV);
            fflush(stderr);
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNKNOWN;
        }
        snprintf(g_dev_dir, sizeof(g_dev_dir), "%s", dev_dir ? dev_dir : "");
        if (strcmp(path, g_path) != 0) {
            spec_free(g_spec);
            g_spec = NULL;
            g_seen_valid = 0;
            snprintf(g_path, sizeof(g_path), "%s", path);
        }
    }
    printed = refresh_locked();
    /* The driver decides at init which GPUs this process may open; the
     * spec may be unchanged while the dev dir or our cgroup differ.  A
     * nested init leaves the running session's indexes alone. */
    if (g_refcount == 0)
        update_visibility_locked();
    if (!g_spec) {
        if (!printed)
            report_error();
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNKNOWN;
    }
    if (g_spec->init_error != NVML_SUCCESS) {
        nvmlReturn_t rc = g_spec->init_error;
        pthread_mutex_unlock(&g_lock);
        return rc;
    }
    g_refcount++;
    /* The spec is loaded only now: the init's latency comes after it. */
    fake_latency(name, -1);
    us = take_latency_us();
    pthread_mutex_unlock(&g_lock);
    if (us)
        sleep_us(us);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlInit(void)
{
    return init_library(__func__);
}

NVML_API nvmlReturn_t nvmlInit_v2(void)
{
    return init_library(__func__);
}

/* Flags (NO_GPUS, NO_ATTACH) change nothing for the fake. */
NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init_library(__func__);
}

/* Reference counted like NVML: only the last shutdown uninitialises.  The
 * spec stays cached so a later nvmlInit is cheap and handles stay mapped. */
NVML_API nvmlReturn_t nvmlShutdown(void)
{
    LATENCY(-1);
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    return fake_error_string(result);
}

/* ======================================================================
 * System queries
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(version, length, g_spec->driver_version));
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(version, length, g_spec->nvml_version));
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!cudaDriverVersion)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *cudaDriverVersion = g_spec->cuda_driver_version;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    LATENCY(-1);
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ======================================================================
 * Device enumeration
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!deviceCount)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = g_n_visible;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    LATENCY(-1);
    return nvmlDeviceGetCount_v2(deviceCount);
}

/* Succeeds for lost GPUs too: NVML hands out the handle and the GPU's
 * calls then fail, which is the situation health checks must handle.
 * `index` counts visible GPUs only (g_visible). */
NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!device || index >= g_n_visible)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = fake_gpu_handle(g_visible[index]);
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    LATENCY(-1);
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Accepts GPU and MIG UUIDs, as NVML does. */
NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LATENCY(-1);
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!uuid || !device)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned k = 0; k < g_spec->n_gpus; k++) {
        const struct fake_gpu *g = &g_spec->gpus[k];
        if (!fake_gpu_visible(k))
            continue;
        if (strcmp(g->uuid, uuid) == 0) {
            *device = fake_gpu_handle(k);
            return fake_leave(NVML_SUCCESS);
        }
        for (unsigned m = 0; g->mig_current && m < g->n_mig; m++) {
            if (strcmp(g->mig[m].uuid, uuid) == 0) {
                *device = mig_handle(k, m);
                return fake_leave(NVML_SUCCESS);
            }
        }
    }
    return fake_leave(NVML_ERROR_NOT_FOUND);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    LATENCY(-1);
    struct fake_pci want;
    nvmlReturn_t rc = fake_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pciBusId || !device || fake_parse_pci(pciBusId, &want) < 0)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned k = 0; k < g_spec->n_gpus; k++) {
        if (fake_gpu_visible(k) && same_pci(&g_spec->gpus[k].pci, &want)) {
            *device = fake_gpu_handle(k);
            return fake_leave(NVML_SUCCESS);
        }
    }
    return fake_leave(NVML_ERROR_NOT_FOUND);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    LATENCY(-1);
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    unsigned gi;
    nvmlReturn_t rc = fake_enter_gpu(device, &g, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!index)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)g_nvml_index[gi]; /* resolve() let only visible GPUs through */
    return fake_leave(NVML_SUCCESS);
}

/* ======================================================================
 * Identity
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(name, length, m ? m->name : g->name));
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(uuid, length, m ? m->uuid : g->uuid));
}

NVML_API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(serial, length, g->serial));
}

NVML_API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(copy_string(version, length, g->vbios));
}

NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    LATENCY(-1);
    return UINT_FIELD(device, minorNumber, minor);
}

NVML_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    LATENCY(-1);
    return UINT_FIELD(device, type, brand);
}

NVML_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    LATENCY(-1);
    return UINT_FIELD(device, arch, architecture);
}

NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!major || !minor)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *major = g->cc_major;
    *minor = g->cc_minor;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    LATENCY(-1);
    return UINT_FIELD(device, mode, persistence);
}

/* ---- PCI ------------------------------------------------------------------ */

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci_info(pci, &g->pci);
    return fake_leave(NVML_SUCCESS);
}

/* The pre-9.0 entry points use the old, 52-byte struct: writing the new
 * 68-byte one would overrun an old caller's buffer. */
NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, fake_pci_info_legacy_t *pci)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci_info_legacy(pci, &g->pci);
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, fake_pci_info_legacy_t *pci)
{
    LATENCY(-1);
    return nvmlDeviceGetPciInfo_v2(device, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (pci->version != NVML_PCI_INFO_EXT_V1)
        return fake_leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    pci->domain = g->pci.domain;
    pci->bus = g->pci.bus;
    pci->device = g->pci.device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    pci->baseClass = 0x3; /* display controller */
    pci->subClass = 0x2;  /* 3D controller, how data-centre GPUs enumerate */
    format_bus_id(&g->pci, pci->busId, sizeof(pci->busId));
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    LATENCY(-1);
    return UINT_FIELD(device, value, pcie_replay);
}

/* "Max" is what the GPU and its slot can do together; "GpuMax" is the
 * GPU's own limit (a Gen5 GPU in a Gen4 slot: max 4, GPU max 5). */
NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    LATENCY(-1);
    return UINT_FIELD(device, currLinkGen, pcie_gen);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    LATENCY(-1);
    return UINT_FIELD(device, maxLinkGen, pcie_max_gen);
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGenDevice)
{
    LATENCY(-1);
    return UINT_FIELD(device, maxLinkGenDevice, pcie_gpu_max_gen);
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    LATENCY(-1);
    return UINT_FIELD(device, currLinkWidth, pcie_width);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    LATENCY(-1);
    return UINT_FIELD(device, maxLinkWidth, pcie_max_width);
}

/* ======================================================================
 * Memory, utilisation, thermals, power, clocks
 * ====================================================================== */

/* Is `pid` a live process of this host (of the caller's PID namespace)?
 * kill(pid, 0) succeeding or failing with EPERM means the pid exists; a
 * zombie (or dead) process is not alive, because the real driver releases
 * an exiting process's GPU context and memory before its parent reaps it.
 * Used for "while_alive" process entries; errno is preserved. */
static int pid_alive(unsigned pid)
{
    char path[48], stat_line[512];
    const char *paren;
    ssize_t len;
    int fd, alive, saved_errno = errno;

    /* 0 and values above INT_MAX would make kill() address process groups. */
    if (pid == 0 || pid > INT_MAX) {
        alive = 0;
    } else if (kill((pid_t)pid, 0) != 0 && errno != EPERM) {
        alive = 0;
    } else {
        snprintf(path, sizeof(path), "/proc/%u/stat", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            /* Gone between kill() and open(): dead.  Any other failure
             * (no /proc, no permission): trust kill(). */
            alive = errno != ENOENT && errno != ESRCH;
        } else {
            len = read(fd, stat_line, sizeof(stat_line) - 1);
            close(fd);
            if (len <= 0) {
                alive = 0; /* reaped while we read it */
            } else {
                /* "pid (comm) S ...": comm may itself contain ')'. */
                stat_line[len] = '\0';
                paren = strrchr(stat_line, ')');
                alive = !(paren && paren[1] == ' ' &&
                          (paren[2] == 'Z' || paren[2] == 'X' || paren[2] == 'x'));
            }
        }
    }
    errno = saved_errno;
    return alive;
}

/* Lock held.  Is process entry `p` listed on the device (GPU, or MIG device
 * `m` when not NULL)?  Entries without "while_alive" always are. */
static int process_listed(const struct fake_process *p, const struct fake_mig *m)
{
    if (m && p->gpu_instance_id != m->gpu_instance_id)
        return 0;
    return !p->while_alive || pid_alive(p->pid);
}

/* The driver's reserve on the device: the GPU's, none on a MIG device. */
static unsigned long long memory_reserved(const struct fake_gpu *g, const struct fake_mig *m)
{
    return m ? 0 : g->memory_reserved;
}

/* Lock held.  Memory used on the device beyond the driver's reserve (v2's
 * "used"): the spec's memory_used plus the used_memory of each listed, live
 * "while_alive" entry of either process list.  A pid listed more than once
 * (e.g. in both lists, as a process with compute and graphics contexts is)
 * counts once, with its first entry (compute list first).  Capped at what
 * the reserve leaves of the total, as real memory cannot overflow. */
static unsigned long long memory_used(const struct fake_gpu *g, const struct fake_mig *m)
{
    unsigned long long used = m ? m->memory_used : g->memory_used;
    unsigned long long total = (m ? m->memory_total : g->memory_total) - memory_reserved(g, m);

    if (used > total)
        used = total;
    size_t count = g->n_procs + g->n_gfx_procs;

    for (size_t k = 0; k < count; k++) {
        const struct fake_process *p =
            k < g->n_procs ? &g->procs[k] : &g->gfx_procs[k - g->n_procs];
        int seen = 0;

        if (!p->while_alive || (m && p->gpu_instance_id != m->gpu_instance_id))
            continue;
        for (size_t j = 0; j < k && !seen; j++) {
            const struct fake_process *q =
                j < g->n_procs ? &g->procs[j] : &g->gfx_procs[j - g->n_procs];
            seen = q->while_alive && q->pid == p->pid &&
                   (!m || q->gpu_instance_id == m->gpu_instance_id);
        }
        if (seen || !pid_alive(p->pid))
            continue;
        used = p->used_memory > total - used ? total : used + p->used_memory;
    }
    return used;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* v1 counts the driver's reserve as used: 615 MiB on an idle H200. */
    memory->total = m ? m->memory_total : g->memory_total;
    memory->used = memory_reserved(g, m) + memory_used(g, m);
    memory->free = memory->total - memory->used;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2)
        return fake_leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    /* v2 keeps the reserve apart: used is 0 on an idle GPU. */
    memory->total = m ? m->memory_total : g->memory_total;
    memory->reserved = memory_reserved(g, m);
    memory->used = memory_used(g, m);
    memory->free = memory->total - memory->reserved - memory->used;
    return fake_leave(NVML_SUCCESS);
}

/* Whether the fake libcuda, loaded in this process, runs work on this GPU now:
 * then it answers as the recorded H200 under load (the spec's "load"). Looked
 * up until found: a process may load libcuda after its first NVML call. */
static int under_load(const struct fake_gpu *g)
{
    static int (*busy)(unsigned, unsigned, unsigned);
    int (*found)(unsigned, unsigned, unsigned) = __atomic_load_n(&busy, __ATOMIC_ACQUIRE);
    if (!found) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!cuda)
            return 0;
        *(void **)&found = dlsym(cuda, "fakecuda_busy");
        dlclose(cuda); /* the process's own handle keeps it loaded */
        if (!found)
            return 0;
        __atomic_store_n(&busy, found, __ATOMIC_RELEASE);
    }
    return found(g->pci.domain, g->pci.bus, g->pci.device);
}

NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!utilization)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = under_load(g) ? g->load.util_gpu : g->util_gpu;
    utilization->memory = g->util_memory;
    return fake_leave(NVML_SUCCESS);
}

/* Only NVML_TEMPERATURE_GPU (0) exists as a sensor. */
NVML_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!temp || sensorType != 0)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temperature;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!temperature)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != NVML_TEMPERATURE_V1)
        return fake_leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != 0)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    temperature->temperature = (int)g->temperature;
    return fake_leave(NVML_SUCCESS);
}

/* thresholdType: NVML_TEMPERATURE_THRESHOLD_SHUTDOWN=0, SLOWDOWN=1,
 * MEM_MAX=2, GPU_MAX=3.  The acoustic and GPS thresholds (4..7) are
 * GeForce/notebook features: NOT_SUPPORTED, as is a threshold the spec
 * marks as not reported (-1). */
NVML_API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int thresholdType, unsigned int *temp)
{
    LATENCY((long)thresholdType);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!temp)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (thresholdType >= sizeof(g->temp_thresholds) / sizeof(g->temp_thresholds[0]) ||
        g->temp_thresholds[thresholdType] == FAKE_THRESHOLD_NONE)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    *temp = (unsigned)g->temp_thresholds[thresholdType];
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!power)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *power = under_load(g) ? g->load.power_usage : g->power_usage;
    return fake_leave(NVML_SUCCESS);
}

/* A counter in mJ: the spec's "energy" plus power_usage (mW) for every
 * second since this spec version was loaded, so two reads bracket the
 * energy used in between.  mW * s = mJ; split into whole seconds and the
 * rest so that neither product overflows (4e9 mW * 1e9 ns < 2^64). */
NVML_API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    long long elapsed;
    unsigned long long sec, nsec;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!energy)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    elapsed = monotonic_ns() - g_spec->loaded_ns;
    if (elapsed < 0)
        elapsed = 0;
    sec = (unsigned long long)elapsed / 1000000000ULL;
    nsec = (unsigned long long)elapsed % 1000000000ULL;
    *energy = g->energy + g->power_usage * sec + g->power_usage * nsec / 1000000000ULL;
    return fake_leave(NVML_SUCCESS);
}

/* The fake has a single power limit: configured == enforced == default. */
NVML_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    LATENCY(-1);
    return UINT_FIELD(device, limit, power_limit);
}

NVML_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    LATENCY(-1);
    return UINT_FIELD(device, limit, power_limit);
}

NVML_API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    LATENCY(-1);
    return UINT_FIELD(device, limit, power_limit);
}

/* NVML_CLOCK_GRAPHICS=0, SM=1, MEM=2, VIDEO=3 */
NVML_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    LATENCY((long)type);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!clock)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    switch (type) {
    case 0: *clock = under_load(g) ? g->load.clock_graphics : g->clock_graphics; break;
    case 1: *clock = under_load(g) ? g->load.clock_sm : g->clock_sm; break;
    case 2: *clock = g->clock_mem; break;
    case 3: *clock = g->clock_video; break;
    default: return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    return fake_leave(NVML_SUCCESS);
}

/* The throttle-reason call is the deprecated name of the event-reason one;
 * callers use either depending on their pynvml version. */
static nvmlReturn_t clocks_event_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!reasons)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = under_load(g) ? g->load.clocks_event_reasons : g->clocks_event_reasons;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    LATENCY(-1);
    return clocks_event_reasons(device, reasons);
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    LATENCY(-1);
    return clocks_event_reasons(device, reasons);
}

/* ---- CPU affinity ---------------------------------------------------- */

static nvmlReturn_t fill_cpu_affinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                      unsigned long *cpuSet)
{
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!cpuSet || cpuSetSize == 0)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned w = 0; w < cpuSetSize; w++)
        cpuSet[w] = w < FAKE_CPU_WORDS ? g->cpu_mask[w] : 0;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    LATENCY(-1);
    return fill_cpu_affinity(device, cpuSetSize, cpuSet);
}

/* NODE (0) and SOCKET (1) scopes return the same set: the spec describes
 * one affinity per GPU. */
NVML_API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet, unsigned int scope)
{
    LATENCY(-1);
    if (scope > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fill_cpu_affinity(device, cpuSetSize, cpuSet);
}

/* ======================================================================
 * NVLink
 *
 * link >= NVML_NVLINK_MAX_LINKS (36) -> INVALID_ARGUMENT; links the device
 * does not have (>= nvlink_count) -> "nvlink_past_last" (NOT_SUPPORTED, or
 * INVALID_ARGUMENT as GB200 drivers answer); links below
 * nvlink_count exist, and the first len(nvlink_peers) of them are active.
 * ====================================================================== */

static nvmlReturn_t check_link(const struct fake_gpu *g, unsigned link)
{
    if (link >= FAKE_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= g->nvlink_count)
        return g->nvlink_past_last;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!isActive)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = check_link(g, link);
    if (rc == NVML_SUCCESS)
        *isActive = link < g->nvlink_active;
    return fake_leave(rc);
}

/* An inactive link has no remote end to describe. */
static nvmlReturn_t remote_pci(nvmlDevice_t device, unsigned link, nvmlPciInfo_t *pci,
                               fake_pci_info_legacy_t *legacy)
{
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci && !legacy)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = check_link(g, link);
    if (rc == NVML_SUCCESS && link >= g->nvlink_active)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS && pci)
        fill_pci_info(pci, &g->nvlink_remote[link]);
    if (rc == NVML_SUCCESS && legacy)
        fill_pci_info_legacy(legacy, &g->nvlink_remote[link]);
    return fake_leave(rc);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    LATENCY(-1);
    return remote_pci(device, link, pci, NULL);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, fake_pci_info_legacy_t *pci)
{
    LATENCY(-1);
    return remote_pci(device, link, NULL, pci);
}

/* counter: NVML_NVLINK_ERROR_DL_REPLAY=0, RECOVERY=1, CRC_FLIT=2,
 * CRC_DATA=3, ECC_DATA=4. */
NVML_API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, unsigned int counter, unsigned long long *counterValue)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!counterValue || counter >= FAKE_NVLINK_ERROR_COUNTERS)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = check_link(g, link);
    if (rc == NVML_SUCCESS)
        *counterValue = g->nvlink_errors[link][counter];
    return fake_leave(rc);
}

/* ======================================================================
 * MIG
 * ====================================================================== */

static unsigned max_mig_devices(const struct fake_gpu *g)
{
    if (!g->mig_current)
        return 0; /* "zero if MIG is not supported or enabled" */
    return g->n_mig > MIG_MAX_DEVICES_DEFAULT ? (unsigned)g->n_mig
                                               : MIG_MAX_DEVICES_DEFAULT;
}

NVML_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!currentMode || !pendingMode)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = g->mig_current;
    *pendingMode = g->mig_pending;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = max_mig_devices(g);
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    unsigned gi;
    nvmlReturn_t rc = fake_enter_gpu(device, &g, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!migDevice || index >= max_mig_devices(g))
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= g->n_mig)
        return fake_leave(NVML_ERROR_NOT_FOUND);
    *migDevice = mig_handle(gi, index);
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!isMigDevice)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = m != NULL;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    const struct fake_mig *m;
    unsigned gi;
    nvmlReturn_t rc = enter_device(migDevice, &g, &m, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!device || !m)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = fake_gpu_handle(gi);
    return fake_leave(NVML_SUCCESS);
}

static nvmlReturn_t mig_instance_id(nvmlDevice_t device, unsigned *out, int compute)
{
    const struct fake_gpu *g;
    const struct fake_mig *m;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    /* A full GPU has no instance ids: the real driver answers
     * INVALID_ARGUMENT (the recorded H200, MIG off). */
    if (!out || !m)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = compute ? m->compute_instance_id : m->gpu_instance_id;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    LATENCY(-1);
    return mig_instance_id(device, id, 0);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    LATENCY(-1);
    return mig_instance_id(device, id, 1);
}

/* ======================================================================
 * Memory health: ECC, row remapping, page retirement
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!current || !pending)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *current = g->ecc_current;
    *pending = g->ecc_pending;
    return fake_leave(NVML_SUCCESS);
}

/* errorType: 0 corrected, 1 uncorrected; counterType: 0 volatile,
 * 1 aggregate.  Counters do not exist while ECC is off. */
NVML_API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType, unsigned long long *eccCounts)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!eccCounts || errorType > 1 || counterType > 1)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->ecc_current)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    *eccCounts = g->ecc[counterType][errorType];
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows, unsigned int *isPending, unsigned int *failureOccurred)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = g->remap_corrected;
    *uncRows = g->remap_uncorrected;
    *isPending = g->remap_pending;
    *failureOccurred = g->remap_failure;
    return fake_leave(NVML_SUCCESS);
}

/* Page retirement is pre-Ampere; Hopper answers NOT_SUPPORTED, which is
 * what the fake does unless the spec lists "retired_pages".  Implements
 * NVML's sizing protocol: too small a buffer -> INSUFFICIENT_SIZE with the
 * needed count. */
static nvmlReturn_t retired_pages(nvmlDevice_t device, unsigned cause, unsigned *pageCount,
                                  unsigned long long *addresses,
                                  unsigned long long *timestamps)
{
    const struct fake_gpu *g;
    unsigned n = 0, k = 0;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->retired_supported)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    if (!pageCount || cause > 1)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    for (size_t p = 0; p < g->n_retired; p++)
        n += g->retired[p].cause == cause;
    if (*pageCount < n || (n > 0 && !addresses)) {
        *pageCount = n;
        return fake_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (size_t p = 0; p < g->n_retired; p++) {
        if (g->retired[p].cause != cause)
            continue;
        addresses[k] = g->retired[p].address;
        if (timestamps)
            timestamps[k] = g->retired[p].timestamp;
        k++;
    }
    *pageCount = n;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount, unsigned long long *addresses)
{
    LATENCY(-1);
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

NVML_API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount, unsigned long long *addresses, unsigned long long *timestamps)
{
    LATENCY(-1);
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

NVML_API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!isPending)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->retired_supported)
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    *isPending = g->retired_pending;
    return fake_leave(NVML_SUCCESS);
}

/* ======================================================================
 * Field values
 * ====================================================================== */

/* Each value carries its own nvmlReturn: the call succeeds, and a field
 * the fake does not model says NOT_SUPPORTED in its slot (valueType 0), as
 * NVML does for fields a GPU lacks (the recorded H200: NVLink CRC, id 38).
 * The fake's fields are unsigned ints but the remapped rows (unsigned long
 * long, as recorded); the whole union is zeroed first, so a reader of
 * ullVal gets the same number.
 * scopeId is left as the caller set it (pynvml: 0, or the tuple's second
 * element). */
NVML_API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    struct timespec now;
    long long stamp;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (valuesCount < 0 || (valuesCount > 0 && !values))
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    clock_gettime(CLOCK_REALTIME, &now);
    stamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
    for (int k = 0; k < valuesCount; k++) {
        nvmlFieldValue_t *v = &values[k];
        memset(&v->value, 0, sizeof(v->value));
        v->timestamp = stamp;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->nvmlReturn = NVML_SUCCESS;
        switch (v->fieldId) {
        case NVML_FI_DEV_MEMORY_TEMP: v->value.uiVal = g->memory_temperature; break;
        case NVML_FI_DEV_PCIE_REPLAY_COUNTER: v->value.uiVal = g->pcie_replay; break;
        /* The recorded H200 gives the remapped rows as unsigned long long. */
        case NVML_FI_DEV_REMAPPED_COR:
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = g->remap_corrected;
            break;
        case NVML_FI_DEV_REMAPPED_UNC:
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = g->remap_uncorrected;
            break;
        case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            v->value.uiVal = g->gpu_recovery_action;
            break;
        default:
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            v->valueType = 0;
            break;
        }
    }
    return fake_leave(NVML_SUCCESS);
}

/* ======================================================================
 * NVLink fabric (GPUs behind NVSwitches managed by the fabric manager)
 *
 * A GPU off a fabric answers SUCCESS with state 0
 * (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) and status SUCCESS, as the recorded
 * H200 on driver 580 did; "fabric": "<error>" makes both calls fail instead.
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!gpuFabricInfo)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g->fabric_error)
        return fake_leave(g->fabric_error);
    memcpy(gpuFabricInfo->clusterUuid, g->fabric_cluster_uuid, FAKE_FABRIC_UUID_LEN);
    gpuFabricInfo->status = g->fabric_status;
    gpuFabricInfo->cliqueId = g->fabric_clique_id;
    gpuFabricInfo->state = g->fabric_state;
    return fake_leave(NVML_SUCCESS);
}

/* Versioned: the caller sets version to nvmlGpuFabricInfo_v2 or _v3 and
 * only that struct's bytes are written.  v3's healthSummary is
 * NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED (0): the spec describes
 * the health mask only. */
NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, fake_fabric_info_v2_t *gpuFabricInfo)
{
    LATENCY(-1);
    const struct fake_gpu *g;
    nvmlReturn_t rc = enter_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!gpuFabricInfo)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpuFabricInfo->version != NVML_GPU_FABRIC_INFO_V2 &&
        gpuFabricInfo->version != NVML_GPU_FABRIC_INFO_V3)
        return fake_leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->fabric_error)
        return fake_leave(g->fabric_error);
    /* The v2 fields are a prefix of v3, at the same offsets. */
    memcpy(gpuFabricInfo->clusterUuid, g->fabric_cluster_uuid, FAKE_FABRIC_UUID_LEN);
    gpuFabricInfo->status = g->fabric_status;
    gpuFabricInfo->cliqueId = g->fabric_clique_id;
    gpuFabricInfo->state = g->fabric_state;
    gpuFabricInfo->healthMask = g->fabric_health_mask;
    if (gpuFabricInfo->version == NVML_GPU_FABRIC_INFO_V3)
        ((fake_fabric_info_v3_t *)gpuFabricInfo)->healthSummary = 0;
    return fake_leave(NVML_SUCCESS);
}

/* ======================================================================
 * Running processes
 * ====================================================================== */

/* NVML's sizing protocol: *infoCount smaller than the number of processes
 * (pynvml's first call passes 0 and NULL) -> INSUFFICIENT_SIZE and the
 * needed count; no processes -> SUCCESS with 0.  On a MIG handle only the
 * processes of that GPU instance are listed; "while_alive" entries only
 * while their process lives (pid_alive). */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned *infoCount, void *infos,
                                   int graphics, int v1_layout)
{
    const struct fake_gpu *g;
    const struct fake_mig *m;
    const struct fake_process *procs;
    size_t total;
    unsigned n = 0, k = 0;
    char *listed;
    nvmlReturn_t rc = enter_device(device, &g, &m, NULL);

    if (rc != NVML_SUCCESS)
        return rc;
    if (g->process_list_delay_ms) {
        /* A call blocked in the driver (a GPU falling off the bus).  The
         * lock is dropped meanwhile, so other threads' calls go on, and
         * the answer reflects the spec as it is when the sleep ends. */
        unsigned delay = g->process_list_delay_ms;
        fake_leave(NVML_SUCCESS);
        fake_sleep_ms(delay);
        /* The query delay (if any) was already taken on entry. */
        rc = enter_handle(device, &g, &m, NULL, 0);
        if (rc != NVML_SUCCESS)
            return rc;
    }
    if (!infoCount)
        return fake_leave(NVML_ERROR_INVALID_ARGUMENT);
    procs = graphics ? g->gfx_procs : g->procs;
    total = graphics ? g->n_gfx_procs : g->n_procs;
    /* Decide each entry once: a "while_alive" process that exits between
     * counting and filling must not leave a zeroed slot in the count. */
    listed = malloc(total ? total : 1);
    if (!listed)
        return fake_leave(NVML_ERROR_MEMORY);
    for (size_t p = 0; p < total; p++)
        n += listed[p] = (char)process_listed(&procs[p], m);
    if (*infoCount < n || (n > 0 && !infos)) {
        free(listed);
        *infoCount = n;
        return fake_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (size_t p = 0; p < total; p++) {
        if (!listed[p])
            continue;
        if (v1_layout) {
            fake_process_info_v1_t *out = (fake_process_info_v1_t *)infos + k;
            memset(out, 0, sizeof(*out));
            out->pid = procs[p].pid;
            out->usedGpuMemory = procs[p].used_memory;
        } else {
            fake_process_info_v2_t *out = (fake_process_info_v2_t *)infos + k;
            memset(out, 0, sizeof(*out));
            out->pid = procs[p].pid;
            out->usedGpuMemory = procs[p].used_memory;
            out->gpuInstanceId = procs[p].gpu_instance_id;
            out->computeInstanceId = procs[p].compute_instance_id;
        }
        k++;
    }
    free(listed);
    *infoCount = n;
    return fake_leave(NVML_SUCCESS);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v1_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 0, 1);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v2_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 0, 0);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v2_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 0, 0);
}

NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v1_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 1, 1);
}

NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v2_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 1, 0);
}

NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, fake_process_info_v2_t *infos)
{
    LATENCY(-1);
    return list_processes(device, infoCount, infos, 1, 0);
}

/* ======================================================================
 * Stubs
 * ====================================================================== */

/* Called by the generated stubs (devcluster/fakenvml/__init__.py) for the entry
 * points the fake does not implement, with their first argument.  NVML
 * device calls take the device handle first, so a stub can still honour
 * "every call on a lost GPU fails with GPU_IS_LOST" (and query_error,
 * query_delay_ms); anything else is NOT_SUPPORTED.  decode_handle only
 * compares addresses, so a first argument that is not a handle (an index,
 * a struct pointer) is harmless. */
int fake_stub_result(const void *first_arg)
{
    nvmlDevice_t handle = (nvmlDevice_t)(uintptr_t)first_arg;
    const struct fake_gpu *g;
    const struct fake_mig *m;
    unsigned gi;
    int mi;
    nvmlReturn_t rc;

    if (decode_handle(handle, &gi, &mi) < 0) {
        rc = fake_enter();
        if (rc != NVML_SUCCESS)
            return rc;
        return fake_leave(NVML_ERROR_NOT_SUPPORTED);
    }
    /* A handle of ours: only UNINITIALIZED, GPU_IS_LOST (lost, hidden,
     * gone) and the GPU's query_error can come back besides success. */
    rc = enter_handle(handle, &g, &m, NULL, 1);
    if (rc != NVML_SUCCESS)
        return rc;
    return fake_leave(NVML_ERROR_NOT_SUPPORTED);
}

/* ======================================================================
 * Events (the event sets themselves live in events.c)
 * ====================================================================== */

NVML_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    LATENCY(-1);
    return U64_FIELD(device, eventTypes, supported_events);
}
