/*
 * JSON spec file -> struct fake_spec (see spec.h, README.md).
 *
 * Validation is deliberately strict: an unknown key or a wrong type is an
 * error that names the offending JSON path, because a silently ignored typo
 * ("temprature") in a test fixture produces a test that passes for the wrong
 * reason.  Keys starting with "_" are ignored so fixtures can carry comments.
 */
#define _GNU_SOURCE /* off_t, sysconf, strcasecmp under strict -std= modes */
#include "spec.h"
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Spec files are tiny; refuse anything absurd instead of allocating it. */
#define SPEC_MAX_BYTES (16u * 1024u * 1024u)

#define GIB (1024ULL * 1024ULL * 1024ULL)

/* The recorded H200 (tests/data/real-gpu/h200-580-idle.json, driver
 * 580.159.04): its memory, and what the driver keeps of it with no process
 * on the GPU (v1's used, v2's reserved). */
#define H200_MEMORY_TOTAL 150754820096ULL
#define H200_MEMORY_RESERVED 644939776ULL

/* ---- NVML error codes --------------------------------------------------- */

static const struct {
    int code;
    const char *name;
    const char *message; /* what the real nvmlErrorString returns */
} error_table[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt Request Issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH",
     "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {22, "VGPU_ECC_NOT_SUPPORTED",
     "The requested vgpu operation is not available on target device, "
     "because ECC is enabled"},
    {23, "INSUFFICIENT_RESOURCES",
     "Ran out of critical resources, other than memory"},
    {24, "FREQ_NOT_SUPPORTED", "The requested frequency is not supported"},
    {25, "ARGUMENT_VERSION_MISMATCH",
     "The provided version is invalid/unsupported"},
    {26, "DEPRECATED", "The requested functionality has been deprecated"},
    {27, "NOT_READY", "The system is not ready for the request"},
    {28, "GPU_NOT_FOUND", "The GPU was not found"},
    {29, "INVALID_STATE", "Resource is in invalid state"},
    {30, "RESET_TYPE_NOT_SUPPORTED", "The reset type is not supported"},
    {999, "UNKNOWN", "Unknown Error"},
};

const char *fake_error_string(int code)
{
    for (size_t k = 0; k < sizeof(error_table) / sizeof(error_table[0]); k++)
        if (error_table[k].code == code)
            return error_table[k].message;
    return "Unknown Error";
}

int fake_error_from_name(const char *name)
{
    if (strncasecmp(name, "NVML_ERROR_", 11) == 0)
        name += 11;
    for (size_t k = 0; k < sizeof(error_table) / sizeof(error_table[0]); k++)
        if (strcasecmp(error_table[k].name, name) == 0)
            return error_table[k].code;
    return -1;
}

/* ---- PCI addresses ---------------------------------------------------- */

static int hex_field(const char **cursor, unsigned long max, char terminator,
                     unsigned *out)
{
    const char *s = *cursor;
    unsigned long v = 0;
    int digits = 0;

    while (isxdigit((unsigned char)*s)) {
        if (++digits > 8)
            return -1;
        v = v * 16 + (unsigned long)(isdigit((unsigned char)*s)
                                         ? *s - '0'
                                         : tolower((unsigned char)*s) - 'a' + 10);
        s++;
    }
    if (digits == 0 || v > max || *s != terminator)
        return -1;
    *cursor = terminator ? s + 1 : s;
    *out = (unsigned)v;
    return 0;
}

/* Accepts "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" and "BB:DD.F" (hex, any case),
 * the forms NVML itself accepts in nvmlDeviceGetHandleByPciBusId. */
int fake_parse_pci(const char *s, struct fake_pci *out)
{
    int colons = 0;
    struct fake_pci pci = {0, 0, 0, 0};

    for (const char *p = s; *p; p++)
        colons += *p == ':';
    if (colons == 2) {
        if (hex_field(&s, 0xFFFFFFFFUL, ':', &pci.domain) < 0)
            return -1;
    } else if (colons != 1) {
        return -1;
    }
    if (hex_field(&s, 0xFF, ':', &pci.bus) < 0 ||
        hex_field(&s, 0x1F, '.', &pci.device) < 0 ||
        hex_field(&s, 0x7, '\0', &pci.function) < 0)
        return -1;
    *out = pci;
    return 0;
}

/* ---- defaults ----------------------------------------------------------- */

/* Keep in sync with __init__.py:default_gpus so that a spec
 * with only "count" and one written by default_gpus describe the same GPUs.
 * Where the recorded H200 (tests/data/real-gpu/h200-580-idle.json) answered
 * something, these are its answers: idle clocks and clock reasons, memory and
 * its reserve, thresholds, no NVLink. */
static void gpu_defaults(struct fake_gpu *g, unsigned index)
{
    long host_cpus = sysconf(_SC_NPROCESSORS_CONF);

    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "NVIDIA H200");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-%08x-0000-4000-8000-%012x",
             0xfa4e0000u + index, index);
    snprintf(g->serial, sizeof(g->serial), "165492400%04u", index);
    /* The recorded H200's (nvidia-smi -q: "VBIOS Version : 96.00.A5.00.1A"). */
    snprintf(g->vbios, sizeof(g->vbios), "96.00.A5.00.1A");
    g->minor = index;
    g->pci.domain = index / 30;
    g->pci.bus = 0x10 + 8 * (index % 30);
    g->pci_device_id = 0x233510DE;    /* device 0x2335 (H200), vendor NVIDIA */
    g->pci_subsystem_id = 0x18BF10DE;
    g->memory_total = H200_MEMORY_TOTAL;
    g->memory_reserved = H200_MEMORY_RESERVED;
    g->temperature = 37;
    g->power_usage = 78692;
    g->power_limit = 700000;
    /* Without an explicit affinity the GPU is "close" to every host CPU,
     * which is what a process binding itself to the GPU's CPUs can use. */
    if (host_cpus < 1)
        host_cpus = 1;
    if (host_cpus > FAKE_MAX_CPUS)
        host_cpus = FAKE_MAX_CPUS;
    for (long c = 0; c < host_cpus; c++)
        g->cpu_mask[c / 64] |= 1ULL << (c % 64);
    /* No NVLink unless the spec lists peers (the recorded H200 had none). */
    g->nvlink_count = 0;
    g->nvlink_past_last = 3; /* NVML_ERROR_NOT_SUPPORTED; GB200 drivers: INVALID_ARGUMENT */
    g->ecc_current = g->ecc_pending = 1;
    /* Idle: NVML_CLOCKS_EVENT_REASON_GPU_IDLE, and the idle clocks. */
    g->clocks_event_reasons = 0x1;
    g->clock_sm = 345;
    g->clock_graphics = 345;
    /* h200-580-load.json: SM and graphics 1470 MHz, 693,219 mW, utilization
     * 100 %, clocks event reasons 0x4 (software power cap) */
    g->load.clock_sm = 1470;
    g->load.clock_graphics = 1470;
    g->load.power_usage = 693219;
    g->load.util_gpu = 100;
    g->load.clocks_event_reasons = 0x4;
    g->clock_mem = 3201;
    g->clock_video = 765;
    g->persistence = 1;
    g->brand = 14;       /* NVML_BRAND_NVIDIA */
    g->architecture = 9; /* NVML_DEVICE_ARCH_HOPPER */
    g->cc_major = 9;
    g->cc_minor = 0;
    /* nvmlEventTypeAll as of NVML 12.x/13.x */
    g->supported_events = 0xFF9FULL;
    /* H200 SXM: a Gen5 x16 link in a Gen5 slot; its thermal limits. */
    g->pcie_gen = g->pcie_max_gen = g->pcie_gpu_max_gen = 5;
    g->pcie_width = g->pcie_max_width = 16;
    g->temp_thresholds[0] = 95;                  /* SHUTDOWN */
    g->temp_thresholds[1] = 89;                  /* SLOWDOWN */
    g->temp_thresholds[2] = FAKE_THRESHOLD_NONE; /* MEM_MAX: NOT_SUPPORTED */
    g->temp_thresholds[3] = 87;                  /* GPU_MAX */
    g->memory_temperature = 39;
}

/* ---- typed accessors with error paths ------------------------------- */

typedef struct {
    char *err;
    size_t errlen;
} ctx;

static int errf(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int errf(ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* snprintf for JSON paths and derived names.  Truncation is harmless there
 * (they only feed messages or get cut like NVML would cut them), and going
 * through vsnprintf keeps -Wformat-truncation from flagging every call. */
static const char *fmt_into(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static const char *fmt_into(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}

/* "gpus[1]" + "memory_total" -> "gpus[1].memory_total" (for messages). */
static const char *join(char *buf, size_t cap, const char *where, const char *key)
{
    return fmt_into(buf, cap, "%s%s%s", where, *where ? "." : "", key);
}

static int check_keys(ctx *c, const char *where, const json_value *obj,
                      const char *const *allowed)
{
    for (size_t k = 0; k < obj->count; k++) {
        const char *key = obj->keys[k];
        int ok = key[0] == '_';
        for (const char *const *a = allowed; !ok && *a; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok)
            return errf(c, "%s%sunknown key \"%s\"", where, *where ? ": " : "", key);
    }
    return 0;
}

static int expect_object(ctx *c, const char *what, const json_value *v)
{
    if (v->type != JSON_OBJECT)
        return errf(c, "%s: expected an object, got %s", what,
                    json_type_name(v->type));
    return 0;
}

static int expect_array(ctx *c, const char *what, const json_value *v)
{
    if (v->type != JSON_ARRAY)
        return errf(c, "%s: expected an array, got %s", what,
                    json_type_name(v->type));
    return 0;
}

/* Present and not null: JSON null means "use the default" everywhere. */
static const json_value *member(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static int value_u64(ctx *c, const char *what, const json_value *v,
                     unsigned long long max, unsigned long long *out)
{
    /* Booleans are accepted as 0/1 because flags like "lost" or "pending"
     * read naturally either way. */
    if (v->type == JSON_BOOL) {
        *out = (unsigned long long)v->boolean;
        return 0;
    }
    if (v->type != JSON_NUMBER || !v->is_int || v->is_negative)
        return errf(c, "%s: expected a non-negative integer", what);
    if (v->u > max)
        return errf(c, "%s: %llu is larger than %llu", what, v->u, max);
    *out = v->u;
    return 0;
}

static int opt_u64(ctx *c, const char *where, const json_value *obj,
                   const char *key, unsigned long long max,
                   unsigned long long *out)
{
    char buf[160];
    const json_value *v = member(obj, key);
    if (!v)
        return 0;
    return value_u64(c, join(buf, sizeof(buf), where, key), v, max, out);
}

static int opt_uint(ctx *c, const char *where, const json_value *obj,
                    const char *key, unsigned max, unsigned *out)
{
    unsigned long long v = *out;
    if (opt_u64(c, where, obj, key, max, &v) < 0)
        return -1;
    *out = (unsigned)v;
    return 0;
}

static int opt_int(ctx *c, const char *where, const json_value *obj,
                   const char *key, int *out)
{
    char buf[160];
    const json_value *v = member(obj, key);
    if (!v)
        return 0;
    if (v->type != JSON_NUMBER || !v->is_int || v->i < INT_MIN || v->i > INT_MAX)
        return errf(c, "%s: expected an integer",
                    join(buf, sizeof(buf), where, key));
    *out = (int)v->i;
    return 0;
}

static int opt_str(ctx *c, const char *where, const json_value *obj,
                   const char *key, char *dst, size_t cap)
{
    char buf[160];
    const json_value *v = member(obj, key);
    if (!v)
        return 0;
    join(buf, sizeof(buf), where, key);
    if (v->type != JSON_STRING)
        return errf(c, "%s: expected a string, got %s", buf,
                    json_type_name(v->type));
    if (strlen(v->str) >= cap)
        return errf(c, "%s: longer than %zu characters", buf, cap - 1);
    snprintf(dst, cap, "%s", v->str);
    return 0;
}

/* An NVML error as a name ("GPU_IS_LOST", case-insensitive, NVML_ERROR_
 * prefix optional) or a code; used by init_error, query_error and
 * fabric.status. */
static int opt_error(ctx *c, const char *where, const json_value *obj,
                     const char *key, int *out)
{
    char buf[160];
    const json_value *v = member(obj, key);
    if (!v)
        return 0;
    if (v->type == JSON_STRING) {
        int code = fake_error_from_name(v->str);
        if (code < 0)
            return errf(c, "%s: unknown NVML error name \"%s\"",
                        join(buf, sizeof(buf), where, key), v->str);
        *out = code;
        return 0;
    }
    return opt_int(c, where, obj, key, out);
}

static int value_pci(ctx *c, const char *what, const json_value *v,
                     struct fake_pci *out)
{
    if (v->type != JSON_STRING || fake_parse_pci(v->str, out) < 0)
        return errf(c, "%s: expected a PCI bus id like \"00000000:05:00.0\"",
                    what);
    return 0;
}

/* A flag that may be given as one value (current = pending) or as
 * {"current": x, "pending": y}; used by mig_mode and ecc_mode. */
static int opt_mode(ctx *c, const char *where, const json_value *obj,
                    const char *key, unsigned *current, unsigned *pending)
{
    static const char *const keys[] = {"current", "pending", NULL};
    char buf[160];
    const json_value *v = member(obj, key);
    unsigned long long x;

    if (!v)
        return 0;
    join(buf, sizeof(buf), where, key);
    if (v->type != JSON_OBJECT) {
        if (value_u64(c, buf, v, 1, &x) < 0)
            return -1;
        *current = *pending = (unsigned)x;
        return 0;
    }
    if (check_keys(c, buf, v, keys) < 0 ||
        opt_uint(c, buf, v, "current", 1, current) < 0)
        return -1;
    *pending = *current;
    return opt_uint(c, buf, v, "pending", 1, pending);
}

/* ---- per-GPU sections --------------------------------------------------- */

static int parse_cpu_affinity(ctx *c, const char *where, const json_value *v,
                              struct fake_gpu *g)
{
    if (expect_array(c, where, v) < 0)
        return -1;
    memset(g->cpu_mask, 0, sizeof(g->cpu_mask));
    for (size_t k = 0; k < v->count; k++) {
        char buf[160];
        unsigned long long cpu;
        fmt_into(buf, sizeof(buf), "%s[%zu]", where, k);
        if (value_u64(c, buf, &v->items[k], FAKE_MAX_CPUS - 1, &cpu) < 0)
            return -1;
        g->cpu_mask[cpu / 64] |= 1ULL << (cpu % 64);
    }
    return 0;
}

static int parse_nvlink(ctx *c, const char *where, const json_value *gobj,
                        struct fake_gpu *g)
{
    static const char *const counter_keys[] = {
        "replay", "recovery", "crc_flit", "crc_data", "ecc_data", NULL};
    char buf[160];
    const json_value *peers = member(gobj, "nvlink_peers");
    const json_value *errs = member(gobj, "nvlink_errors");
    int count_given = member(gobj, "nvlink_count") != NULL;

    if (opt_uint(c, where, gobj, "nvlink_count", FAKE_NVLINK_MAX_LINKS,
                 &g->nvlink_count) < 0)
        return -1;
    if (peers) {
        join(buf, sizeof(buf), where, "nvlink_peers");
        if (expect_array(c, buf, peers) < 0)
            return -1;
        if (peers->count > FAKE_NVLINK_MAX_LINKS)
            return errf(c, "%s: more than %d links", buf, FAKE_NVLINK_MAX_LINKS);
        /* Peers make it an NVLink GPU with a link per peer, all of them
         * active, as on a healthy board; "nvlink_count" gives it more links
         * than peers (Hopper's 18 with some inactive). */
        if (!count_given && peers->count > 0)
            g->nvlink_count = (unsigned)peers->count;
        if (peers->count > g->nvlink_count)
            return errf(c, "%s: %zu peers but nvlink_count is %u", buf,
                        peers->count, g->nvlink_count);
        for (size_t k = 0; k < peers->count; k++) {
            char item[176];
            fmt_into(item, sizeof(item), "%s[%zu]", buf, k);
            if (value_pci(c, item, &peers->items[k], &g->nvlink_remote[k]) < 0)
                return -1;
        }
        g->nvlink_active = (unsigned)peers->count;
    }
    if (errs) {
        join(buf, sizeof(buf), where, "nvlink_errors");
        if (expect_array(c, buf, errs) < 0)
            return -1;
        if (errs->count > g->nvlink_count)
            return errf(c, "%s: %zu entries but nvlink_count is %u", buf,
                        errs->count, g->nvlink_count);
        for (size_t k = 0; k < errs->count; k++) {
            char item[176];
            const json_value *e = &errs->items[k];
            fmt_into(item, sizeof(item), "%s[%zu]", buf, k);
            if (expect_object(c, item, e) < 0 || check_keys(c, item, e, counter_keys) < 0)
                return -1;
            for (int n = 0; counter_keys[n]; n++)
                if (opt_u64(c, item, e, counter_keys[n], ULLONG_MAX,
                            &g->nvlink_errors[k][n]) < 0)
                    return -1;
        }
    }
    return 0;
}

static int parse_mig(ctx *c, const char *where, const json_value *gobj,
                     struct fake_gpu *g, unsigned index)
{
    static const char *const keys[] = {"uuid", "name", "memory_total", "memory_used",
                                       "gpu_instance_id", "compute_instance_id",
                                       NULL};
    char buf[160];
    const json_value *devs = member(gobj, "mig_devices");

    if (devs) {
        join(buf, sizeof(buf), where, "mig_devices");
        if (expect_array(c, buf, devs) < 0)
            return -1;
        if (devs->count > FAKE_MAX_MIG)
            return errf(c, "%s: at most %d MIG devices", buf, FAKE_MAX_MIG);
        g->n_mig = devs->count;
        /* Listing MIG devices implies MIG is on unless mig_mode says so. */
        if (g->n_mig > 0)
            g->mig_current = g->mig_pending = 1;
        for (size_t k = 0; k < devs->count; k++) {
            char item[176];
            const json_value *d = &devs->items[k];
            struct fake_mig *m = &g->mig[k];
            fmt_into(item, sizeof(item), "%s[%zu]", buf, k);
            snprintf(m->uuid, sizeof(m->uuid), "MIG-%08x-%04zx-5000-8000-%012x",
                     0xfa4e0000u + index, k, index);
            fmt_into(m->name, sizeof(m->name), "%s MIG", g->name);
            m->memory_total = g->memory_total / 8;
            m->gpu_instance_id = (unsigned)k + 1;
            m->compute_instance_id = 0;
            if (expect_object(c, item, d) < 0 || check_keys(c, item, d, keys) < 0 ||
                opt_str(c, item, d, "uuid", m->uuid, sizeof(m->uuid)) < 0 ||
                opt_str(c, item, d, "name", m->name, sizeof(m->name)) < 0 ||
                opt_u64(c, item, d, "memory_total", ULLONG_MAX, &m->memory_total) < 0 ||
                opt_u64(c, item, d, "memory_used", m->memory_total, &m->memory_used) < 0 ||
                opt_uint(c, item, d, "gpu_instance_id", UINT_MAX, &m->gpu_instance_id) < 0 ||
                opt_uint(c, item, d, "compute_instance_id", UINT_MAX,
                         &m->compute_instance_id) < 0)
                return -1;
        }
    }
    return opt_mode(c, where, gobj, "mig_mode", &g->mig_current, &g->mig_pending);
}

static int parse_health(ctx *c, const char *where, const json_value *gobj,
                        struct fake_gpu *g)
{
    static const char *const rr_keys[] = {"corrected", "uncorrected", "pending",
                                          "failure", NULL};
    static const char *const ecc_keys[] = {"volatile", "aggregate", NULL};
    static const char *const cnt_keys[] = {"corrected", "uncorrected", NULL};
    char buf[160];
    const json_value *rr = member(gobj, "remapped_rows");
    const json_value *ecc = member(gobj, "ecc");

    if (rr) {
        join(buf, sizeof(buf), where, "remapped_rows");
        if (expect_object(c, buf, rr) < 0 || check_keys(c, buf, rr, rr_keys) < 0 ||
            opt_uint(c, buf, rr, "corrected", UINT_MAX, &g->remap_corrected) < 0 ||
            opt_uint(c, buf, rr, "uncorrected", UINT_MAX, &g->remap_uncorrected) < 0 ||
            opt_uint(c, buf, rr, "pending", 1, &g->remap_pending) < 0 ||
            opt_uint(c, buf, rr, "failure", 1, &g->remap_failure) < 0)
            return -1;
    }
    if (ecc) {
        join(buf, sizeof(buf), where, "ecc");
        if (expect_object(c, buf, ecc) < 0 || check_keys(c, buf, ecc, ecc_keys) < 0)
            return -1;
        for (int counter = 0; counter < 2; counter++) {
            char sub[176];
            const json_value *v = member(ecc, ecc_keys[counter]);
            if (!v)
                continue;
            fmt_into(sub, sizeof(sub), "%s.%s", buf, ecc_keys[counter]);
            if (expect_object(c, sub, v) < 0 || check_keys(c, sub, v, cnt_keys) < 0 ||
                opt_u64(c, sub, v, "corrected", ULLONG_MAX, &g->ecc[counter][0]) < 0 ||
                opt_u64(c, sub, v, "uncorrected", ULLONG_MAX, &g->ecc[counter][1]) < 0)
                return -1;
        }
    }
    return opt_mode(c, where, gobj, "ecc_mode", &g->ecc_current, &g->ecc_pending);
}

static int parse_retired(ctx *c, const char *where, const json_value *gobj,
                         struct fake_gpu *g)
{
    static const char *const keys[] = {"address", "cause", "timestamp", NULL};
    char buf[160];
    const json_value *pages = member(gobj, "retired_pages");

    if (opt_uint(c, where, gobj, "retired_pages_pending", 1, &g->retired_pending) < 0)
        return -1;
    if (!pages)
        return 0;
    join(buf, sizeof(buf), where, "retired_pages");
    if (expect_array(c, buf, pages) < 0)
        return -1;
    g->retired_supported = 1;
    g->n_retired = pages->count;
    g->retired = calloc(pages->count ? pages->count : 1, sizeof(*g->retired));
    if (!g->retired)
        return errf(c, "%s: out of memory", buf);
    for (size_t k = 0; k < pages->count; k++) {
        char item[176];
        const json_value *p = &pages->items[k];
        const json_value *cause;
        struct fake_retired_page *r = &g->retired[k];
        fmt_into(item, sizeof(item), "%s[%zu]", buf, k);
        r->cause = 1; /* NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR */
        if (expect_object(c, item, p) < 0 || check_keys(c, item, p, keys) < 0 ||
            opt_u64(c, item, p, "address", ULLONG_MAX, &r->address) < 0 ||
            opt_u64(c, item, p, "timestamp", ULLONG_MAX, &r->timestamp) < 0)
            return -1;
        cause = member(p, "cause");
        if (cause && cause->type == JSON_STRING) {
            if (strcmp(cause->str, "single_bit") == 0)
                r->cause = 0;
            else if (strcmp(cause->str, "double_bit") == 0)
                r->cause = 1;
            else
                return errf(c, "%s.cause: expected \"single_bit\" or \"double_bit\"", item);
        } else if (opt_uint(c, item, p, "cause", 1, &r->cause) < 0) {
            return -1;
        }
    }
    return 0;
}

/* {"shutdown", "slowdown", "gpu_max", "mem_max"}: degrees C, or -1 for a
 * threshold the GPU does not report (its query -> NOT_SUPPORTED).  Keys
 * left out or null keep their default. */
static int parse_thresholds(ctx *c, const char *where, const json_value *gobj,
                            struct fake_gpu *g)
{
    /* In nvmlTemperatureThresholds_t order: SHUTDOWN 0, SLOWDOWN 1,
     * MEM_MAX 2, GPU_MAX 3. */
    static const char *const keys[] = {"shutdown", "slowdown", "mem_max", "gpu_max", NULL};
    char buf[160];
    const json_value *t = member(gobj, "temperature_thresholds");

    if (!t)
        return 0;
    join(buf, sizeof(buf), where, "temperature_thresholds");
    if (expect_object(c, buf, t) < 0 || check_keys(c, buf, t, keys) < 0)
        return -1;
    for (int k = 0; keys[k]; k++) {
        char item[176];
        const json_value *v = member(t, keys[k]);
        if (!v)
            continue;
        fmt_into(item, sizeof(item), "%s.%s", buf, keys[k]);
        if (v->type != JSON_NUMBER || !v->is_int ||
            (v->is_negative ? v->i != FAKE_THRESHOLD_NONE : v->u > INT_MAX))
            return errf(c, "%s: expected degrees C (a non-negative integer) or -1 "
                           "(not reported)", item);
        g->temp_thresholds[k] = v->is_negative ? FAKE_THRESHOLD_NONE : (int)v->u;
    }
    return 0;
}

static int parse_pcie(ctx *c, const char *where, const json_value *gobj,
                      struct fake_gpu *g)
{
    static const char *const keys[] = {"gen", "width", "max_gen", "max_width",
                                       "gpu_max_gen", NULL};
    char buf[160];
    const json_value *p = member(gobj, "pcie");

    if (!p)
        return 0;
    join(buf, sizeof(buf), where, "pcie");
    if (expect_object(c, buf, p) < 0 || check_keys(c, buf, p, keys) < 0 ||
        opt_uint(c, buf, p, "gen", UINT_MAX, &g->pcie_gen) < 0 ||
        opt_uint(c, buf, p, "width", UINT_MAX, &g->pcie_width) < 0 ||
        opt_uint(c, buf, p, "max_gen", UINT_MAX, &g->pcie_max_gen) < 0 ||
        opt_uint(c, buf, p, "max_width", UINT_MAX, &g->pcie_max_width) < 0 ||
        opt_uint(c, buf, p, "gpu_max_gen", UINT_MAX, &g->pcie_gpu_max_gen) < 0)
        return -1;
    return 0;
}

/* 32 hex digits, bare or as a GUID with dashes (8-4-4-4-12), into the 16
 * bytes of nvmlGpuFabricInfo_t.clusterUuid, first digits first. */
static int parse_fabric_uuid(const char *s, unsigned char out[FAKE_FABRIC_UUID_LEN])
{
    static const int dash_at[] = {8, 12, 16, 20}; /* digits before each dash */
    size_t len = strlen(s);
    int dashed = len == 36, digits = 0, dash = 0;

    if (len != 32 && !dashed)
        return -1;
    for (const char *p = s; *p; p++) {
        int nibble;
        if (dashed && dash < 4 && digits == dash_at[dash]) {
            if (*p != '-')
                return -1;
            dash++;
            continue;
        }
        if (!isxdigit((unsigned char)*p) || digits >= 2 * FAKE_FABRIC_UUID_LEN)
            return -1;
        nibble = isdigit((unsigned char)*p) ? *p - '0'
                                            : tolower((unsigned char)*p) - 'a' + 10;
        if (digits % 2 == 0)
            out[digits / 2] = (unsigned char)(nibble << 4);
        else
            out[digits / 2] |= (unsigned char)nibble;
        digits++;
    }
    return digits == 2 * FAKE_FABRIC_UUID_LEN ? 0 : -1;
}

/* An object: the GPU is part of an NVLink fabric (nvmlDeviceGetGpuFabricInfo*
 * answer it); an NVML error: those calls fail with it (an older driver's
 * NOT_SUPPORTED); absent: they succeed with state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
 * and status SUCCESS, as the recorded H200 on driver 580 did. */
static int parse_fabric(ctx *c, const char *where, const json_value *gobj,
                        struct fake_gpu *g)
{
    static const char *const keys[] = {"state", "status", "clique_id", "cluster_uuid",
                                       "health_mask", NULL};
    char buf[160];
    const json_value *f = member(gobj, "fabric");
    const json_value *uuid;

    if (!f)
        return 0;
    join(buf, sizeof(buf), where, "fabric");
    if (f->type == JSON_STRING || f->type == JSON_NUMBER) {
        if (opt_error(c, where, gobj, "fabric", &g->fabric_error) < 0)
            return -1;
        if (g->fabric_error == 0)
            return errf(c, "%s: an NVML error the calls fail with, or an object", buf);
        return 0;
    }
    g->fabric_supported = 1;
    g->fabric_state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
    if (expect_object(c, buf, f) < 0 || check_keys(c, buf, f, keys) < 0 ||
        opt_uint(c, buf, f, "state", 3, &g->fabric_state) < 0 ||
        opt_error(c, buf, f, "status", &g->fabric_status) < 0 ||
        opt_uint(c, buf, f, "clique_id", UINT_MAX, &g->fabric_clique_id) < 0 ||
        opt_uint(c, buf, f, "health_mask", UINT_MAX, &g->fabric_health_mask) < 0)
        return -1;
    if ((uuid = member(f, "cluster_uuid")) &&
        (uuid->type != JSON_STRING ||
         parse_fabric_uuid(uuid->str, g->fabric_cluster_uuid) < 0))
        return errf(c, "%s.cluster_uuid: expected 32 hex digits, bare or as "
                       "\"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\"", buf);
    return 0;
}

static int parse_process_list(ctx *c, const char *where, const json_value *gobj,
                              const char *key, struct fake_process **out, size_t *n)
{
    static const char *const keys[] = {"pid", "used_memory", "gpu_instance_id",
                                       "compute_instance_id", "while_alive", NULL};
    char buf[160];
    const json_value *list = member(gobj, key);

    if (!list)
        return 0;
    join(buf, sizeof(buf), where, key);
    if (expect_array(c, buf, list) < 0)
        return -1;
    *out = calloc(list->count ? list->count : 1, sizeof(**out));
    if (!*out)
        return errf(c, "%s: out of memory", buf);
    *n = list->count;
    for (size_t k = 0; k < list->count; k++) {
        char item[176];
        const json_value *p = &list->items[k];
        struct fake_process *proc = &(*out)[k];
        unsigned long long while_alive = 0;
        fmt_into(item, sizeof(item), "%s[%zu]", buf, k);
        /* 0xFFFFFFFF is NVML's "not in a MIG instance" marker. */
        proc->gpu_instance_id = proc->compute_instance_id = 0xFFFFFFFFu;
        if (expect_object(c, item, p) < 0 || check_keys(c, item, p, keys) < 0)
            return -1;
        if (!member(p, "pid"))
            return errf(c, "%s: \"pid\" is required", item);
        if (opt_uint(c, item, p, "pid", UINT_MAX, &proc->pid) < 0 ||
            opt_u64(c, item, p, "used_memory", ULLONG_MAX, &proc->used_memory) < 0 ||
            opt_uint(c, item, p, "gpu_instance_id", UINT_MAX, &proc->gpu_instance_id) < 0 ||
            opt_uint(c, item, p, "compute_instance_id", UINT_MAX,
                     &proc->compute_instance_id) < 0 ||
            opt_u64(c, item, p, "while_alive", 1, &while_alive) < 0)
            return -1;
        proc->while_alive = (int)while_alive;
    }
    return 0;
}

static int parse_gpu(ctx *c, const json_value *gobj, unsigned index,
                     struct fake_gpu *g)
{
    static const char *const keys[] = {
        "name", "uuid", "minor", "pci_bus_id", "pci_device_id", "pci_subsystem_id",
        "serial", "memory_total", "memory_used", "utilization_gpu",
        "utilization_memory", "temperature", "power_usage", "power_limit",
        "cpu_affinity", "nvlink_peers", "nvlink_count", "nvlink_errors",
        "mig_mode", "mig_devices", "lost", "clocks_event_reasons",
        "remapped_rows", "ecc", "ecc_mode", "retired_pages",
        "retired_pages_pending", "processes", "graphics_processes",
        "pcie_replay_counter", "clock_graphics", "clock_sm", "clock_mem",
        "clock_video", "persistence_mode", "brand", "architecture",
        "cuda_compute_capability", "supported_event_types", "process_list_delay_ms",
        "temperature_thresholds", "memory_temperature", "gpu_recovery_action", "pcie",
        "fabric", "energy", "query_error", "query_delay_ms", "memory_reserved",
        "nvlink_past_last", "vbios_version", "load",
        "cuda", /* the fake libcuda's (fakecuda.c): NVML's answers ignore it */
        NULL};
    char where[32], buf[160];
    const json_value *v;
    unsigned long long lost = 0;
    int clock_graphics_given;

    snprintf(where, sizeof(where), "gpus[%u]", index);
    gpu_defaults(g, index);
    if (expect_object(c, where, gobj) < 0 || check_keys(c, where, gobj, keys) < 0)
        return -1;

    if (opt_str(c, where, gobj, "name", g->name, sizeof(g->name)) < 0 ||
        opt_str(c, where, gobj, "uuid", g->uuid, sizeof(g->uuid)) < 0 ||
        opt_str(c, where, gobj, "serial", g->serial, sizeof(g->serial)) < 0 ||
        opt_str(c, where, gobj, "vbios_version", g->vbios, sizeof(g->vbios)) < 0 ||
        opt_uint(c, where, gobj, "minor", UINT_MAX, &g->minor) < 0 ||
        opt_uint(c, where, gobj, "pci_device_id", UINT_MAX, &g->pci_device_id) < 0 ||
        opt_uint(c, where, gobj, "pci_subsystem_id", UINT_MAX, &g->pci_subsystem_id) < 0 ||
        opt_u64(c, where, gobj, "memory_total", ULLONG_MAX, &g->memory_total) < 0 ||
        opt_u64(c, where, gobj, "memory_used", g->memory_total, &g->memory_used) < 0 ||
        opt_u64(c, where, gobj, "memory_reserved", g->memory_total, &g->memory_reserved) < 0 ||
        opt_error(c, where, gobj, "nvlink_past_last", &g->nvlink_past_last) < 0 ||
        opt_uint(c, where, gobj, "utilization_gpu", 100, &g->util_gpu) < 0 ||
        opt_uint(c, where, gobj, "utilization_memory", 100, &g->util_memory) < 0 ||
        opt_uint(c, where, gobj, "temperature", UINT_MAX, &g->temperature) < 0 ||
        opt_uint(c, where, gobj, "power_usage", UINT_MAX, &g->power_usage) < 0 ||
        opt_uint(c, where, gobj, "power_limit", UINT_MAX, &g->power_limit) < 0 ||
        opt_u64(c, where, gobj, "lost", 1, &lost) < 0 ||
        opt_u64(c, where, gobj, "clocks_event_reasons", ULLONG_MAX,
                &g->clocks_event_reasons) < 0 ||
        opt_uint(c, where, gobj, "pcie_replay_counter", UINT_MAX, &g->pcie_replay) < 0 ||
        opt_uint(c, where, gobj, "clock_sm", UINT_MAX, &g->clock_sm) < 0 ||
        opt_uint(c, where, gobj, "clock_mem", UINT_MAX, &g->clock_mem) < 0 ||
        opt_uint(c, where, gobj, "clock_video", UINT_MAX, &g->clock_video) < 0 ||
        opt_uint(c, where, gobj, "persistence_mode", 1, &g->persistence) < 0 ||
        opt_uint(c, where, gobj, "brand", UINT_MAX, &g->brand) < 0 ||
        opt_uint(c, where, gobj, "architecture", UINT_MAX, &g->architecture) < 0 ||
        opt_u64(c, where, gobj, "supported_event_types", ULLONG_MAX,
                &g->supported_events) < 0 ||
        opt_uint(c, where, gobj, "process_list_delay_ms", 3600000, &g->process_list_delay_ms) < 0 ||
        opt_uint(c, where, gobj, "memory_temperature", UINT_MAX, &g->memory_temperature) < 0 ||
        opt_uint(c, where, gobj, "gpu_recovery_action", UINT_MAX, &g->gpu_recovery_action) < 0 ||
        opt_u64(c, where, gobj, "energy", ULLONG_MAX, &g->energy) < 0 ||
        opt_error(c, where, gobj, "query_error", &g->query_error) < 0 ||
        opt_uint(c, where, gobj, "query_delay_ms", 3600000, &g->query_delay_ms) < 0)
        return -1;
    g->lost = (int)lost;

    /* The graphics clock follows the SM clock unless given separately, as
     * on real GPUs where both domains run at the same frequency. */
    clock_graphics_given = member(gobj, "clock_graphics") != NULL;
    g->clock_graphics = g->clock_sm;
    if (clock_graphics_given &&
        opt_uint(c, where, gobj, "clock_graphics", UINT_MAX, &g->clock_graphics) < 0)
        return -1;

    if ((v = member(gobj, "pci_bus_id")) &&
        value_pci(c, join(buf, sizeof(buf), where, "pci_bus_id"), v, &g->pci) < 0)
        return -1;
    if ((v = member(gobj, "cpu_affinity")) &&
        parse_cpu_affinity(c, join(buf, sizeof(buf), where, "cpu_affinity"), v, g) < 0)
        return -1;
    if ((v = member(gobj, "cuda_compute_capability"))) {
        join(buf, sizeof(buf), where, "cuda_compute_capability");
        if (v->type != JSON_ARRAY || v->count != 2 ||
            v->items[0].type != JSON_NUMBER || !v->items[0].is_int ||
            v->items[1].type != JSON_NUMBER || !v->items[1].is_int)
            return errf(c, "%s: expected [major, minor]", buf);
        g->cc_major = (int)v->items[0].i;
        g->cc_minor = (int)v->items[1].i;
    }

    if ((v = member(gobj, "load"))) {
        static const char *const load_keys[] = {"clock_sm", "clock_graphics", "power_usage",
                                                "utilization_gpu", "clocks_event_reasons", NULL};
        join(buf, sizeof(buf), where, "load");
        if (expect_object(c, buf, v) < 0 || check_keys(c, buf, v, load_keys) < 0 ||
            opt_uint(c, buf, v, "clock_sm", UINT_MAX, &g->load.clock_sm) < 0 ||
            opt_uint(c, buf, v, "power_usage", UINT_MAX, &g->load.power_usage) < 0 ||
            opt_uint(c, buf, v, "utilization_gpu", 100, &g->load.util_gpu) < 0 ||
            opt_u64(c, buf, v, "clocks_event_reasons", ULLONG_MAX,
                    &g->load.clocks_event_reasons) < 0)
            return -1;
        g->load.clock_graphics = g->load.clock_sm;  /* as the idle clocks: one domain */
        if (opt_uint(c, buf, v, "clock_graphics", UINT_MAX, &g->load.clock_graphics) < 0)
            return -1;
    }

    if (parse_nvlink(c, where, gobj, g) < 0 || parse_mig(c, where, gobj, g, index) < 0 ||
        parse_health(c, where, gobj, g) < 0 || parse_retired(c, where, gobj, g) < 0 ||
        parse_process_list(c, where, gobj, "processes", &g->procs, &g->n_procs) < 0 ||
        parse_process_list(c, where, gobj, "graphics_processes", &g->gfx_procs,
                           &g->n_gfx_procs) < 0 ||
        parse_thresholds(c, where, gobj, g) < 0 || parse_pcie(c, where, gobj, g) < 0 ||
        parse_fabric(c, where, gobj, g) < 0)
        return -1;
    return 0;
}

/* ---- events and top level ----------------------------------------------- */

static int parse_events(ctx *c, const json_value *list, struct fake_spec *s)
{
    static const char *const keys[] = {"gpu", "xid", "type", "data", "gpu_instance_id",
                                       "compute_instance_id", NULL};

    if (expect_array(c, "events", list) < 0)
        return -1;
    s->events = calloc(list->count ? list->count : 1, sizeof(*s->events));
    if (!s->events)
        return errf(c, "events: out of memory");
    s->n_events = list->count;
    for (size_t k = 0; k < list->count; k++) {
        char item[48];
        const json_value *e = &list->items[k];
        struct fake_event *ev = &s->events[k];
        int has_xid, has_type;

        fmt_into(item, sizeof(item), "events[%zu]", k);
        if (expect_object(c, item, e) < 0 || check_keys(c, item, e, keys) < 0)
            return -1;
        has_xid = member(e, "xid") != NULL;
        has_type = member(e, "type") != NULL;
        if (!member(e, "gpu"))
            return errf(c, "%s: \"gpu\" (index) is required", item);
        if (has_xid == has_type)
            return errf(c, "%s: give exactly one of \"xid\" or \"type\"", item);
        if (has_xid && member(e, "data"))
            return errf(c, "%s: \"data\" goes with \"type\", not \"xid\"", item);
        ev->type = 0x8; /* nvmlEventTypeXidCriticalError */
        ev->gpu_instance_id = ev->compute_instance_id = 0xFFFFFFFFu;
        if (opt_uint(c, item, e, "gpu", UINT_MAX, &ev->gpu) < 0 ||
            opt_u64(c, item, e, "xid", ULLONG_MAX, &ev->data) < 0 ||
            opt_u64(c, item, e, "type", ULLONG_MAX, &ev->type) < 0 ||
            opt_u64(c, item, e, "data", ULLONG_MAX, &ev->data) < 0 ||
            opt_uint(c, item, e, "gpu_instance_id", UINT_MAX, &ev->gpu_instance_id) < 0 ||
            opt_uint(c, item, e, "compute_instance_id", UINT_MAX,
                     &ev->compute_instance_id) < 0)
            return -1;
        if (ev->type == 0)
            return errf(c, "%s.type: must be a non-zero event type bit", item);
    }
    return 0;
}

/* ---- latency -------------------------------------------------------------- */

#include "latency_recorded.h"

/* "recorded": the recorded H200's times (latency_recorded.h); an object
 * {"<entry point>": ms, "<entry point>#<selector>": ms}: those; absent or
 * null: none. */
static int parse_latency(ctx *c, const json_value *v, struct fake_spec *s)
{
    size_t n = sizeof(recorded_latency) / sizeof(recorded_latency[0]);

    if (!v)
        return 0;
    if (v->type == JSON_STRING) {
        if (strcmp(v->str, "recorded") != 0)
            return errf(c, "latency: expected \"recorded\" or an object of entry points and ms");
        s->latency = calloc(n, sizeof(*s->latency));
        if (!s->latency)
            return errf(c, "latency: out of memory");
        memcpy(s->latency, recorded_latency, sizeof(recorded_latency));
        s->n_latency = n;
        return 0;
    }
    if (expect_object(c, "latency", v) < 0)
        return -1;
    s->latency = calloc(v->count ? v->count : 1, sizeof(*s->latency));
    if (!s->latency)
        return errf(c, "latency: out of memory");
    for (size_t k = 0; k < v->count; k++) {
        const char *key = v->keys[k];
        const char *hash = strchr(key, '#');
        const json_value *ms = &v->items[k];
        struct fake_latency *l = &s->latency[s->n_latency];
        size_t len = hash ? (size_t)(hash - key) : strlen(key);
        char *end;

        if (key[0] == '_')
            continue;
        if (len == 0 || len >= sizeof(l->name) || strncmp(key, "nvml", 4) != 0)
            return errf(c, "latency.%s: expected an NVML entry point, optionally with #<selector>", key);
        if (ms->type != JSON_NUMBER || ms->is_negative || ms->d > 60000.0)
            return errf(c, "latency.%s: expected milliseconds from 0 to 60000", key);
        memcpy(l->name, key, len);
        l->name[len] = '\0';
        l->selector = -1;
        if (hash) {
            l->selector = strtol(hash + 1, &end, 10);
            if (end == hash + 1 || *end || l->selector < 0)
                return errf(c, "latency.%s: the selector after # must be a non-negative integer", key);
        }
        l->us = (unsigned)(ms->d * 1000.0 + 0.5);
        s->n_latency++;
    }
    return 0;
}

unsigned spec_latency_us(const struct fake_spec *spec, const char *name, long selector)
{
    unsigned any = 0;

    for (size_t k = 0; k < spec->n_latency; k++) {
        const struct fake_latency *l = &spec->latency[k];
        if (strcmp(l->name, name) != 0)
            continue;
        if (l->selector == selector && selector >= 0)
            return l->us;
        if (l->selector < 0)
            any = l->us;
    }
    return any;
}

static int parse_init_error(ctx *c, const json_value *root, struct fake_spec *s)
{
    return opt_error(c, "", root, "init_error", &s->init_error);
}

static int parse_root(ctx *c, const json_value *root, struct fake_spec *s)
{
    static const char *const keys[] = {"driver_version", "nvml_version",
                                       "cuda_driver_version", "init_error", "gpus",
                                       "count", "events", "latency",
                                       "nccl", /* the fake NCCL's (fakenccl.c): NVML's answers ignore it */
                                       NULL};
    const json_value *gpus, *events;
    unsigned count = 0;

    /* The recorded H200's driver (nvidia-smi: CUDA 13.0). */
    snprintf(s->driver_version, sizeof(s->driver_version), "580.159.04");
    snprintf(s->nvml_version, sizeof(s->nvml_version), "13.580.159.04");
    s->cuda_driver_version = 13000;

    if (expect_object(c, "top level", root) < 0 || check_keys(c, "", root, keys) < 0 ||
        opt_str(c, "", root, "driver_version", s->driver_version,
                sizeof(s->driver_version)) < 0 ||
        opt_str(c, "", root, "nvml_version", s->nvml_version,
                sizeof(s->nvml_version)) < 0 ||
        opt_int(c, "", root, "cuda_driver_version", &s->cuda_driver_version) < 0 ||
        parse_init_error(c, root, s) < 0 ||
        opt_uint(c, "", root, "count", FAKE_MAX_GPUS, &count) < 0)
        return -1;

    gpus = member(root, "gpus");
    if (gpus) {
        if (expect_array(c, "gpus", gpus) < 0)
            return -1;
        if (gpus->count > FAKE_MAX_GPUS)
            return errf(c, "gpus: at most %d GPUs", FAKE_MAX_GPUS);
        count = (unsigned)gpus->count;
    }
    s->gpus = calloc(count ? count : 1, sizeof(*s->gpus));
    if (!s->gpus)
        return errf(c, "gpus: out of memory");
    s->n_gpus = count;
    for (unsigned k = 0; k < count; k++) {
        if (!gpus)
            gpu_defaults(&s->gpus[k], k);
        else if (parse_gpu(c, &gpus->items[k], k, &s->gpus[k]) < 0)
            return -1;
    }

    events = member(root, "events");
    if (events && parse_events(c, events, s) < 0)
        return -1;
    return parse_latency(c, member(root, "latency"), s);
}

/* ---- loading -------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    char *buf;

    if (!f) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) ||
        st.st_size > (off_t)SPEC_MAX_BYTES) {
        snprintf(err, errlen, "not a regular file of at most %u bytes",
                 SPEC_MAX_BYTES);
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        fclose(f);
        return NULL;
    }
    *len = fread(buf, 1, (size_t)st.st_size, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

struct fake_spec *spec_load(const char *path, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = read_file(path, &len, err, errlen);
    json_value root;
    json_error jerr;
    struct fake_spec *spec;
    ctx c = {err, errlen};

    if (!text)
        return NULL;
    if (json_parse(text, len, &root, &jerr) < 0) {
        snprintf(err, errlen, "line %u, column %u (byte %zu): %s", jerr.line,
                 jerr.column, jerr.offset, jerr.message);
        free(text);
        return NULL;
    }
    free(text);
    spec = calloc(1, sizeof(*spec));
    if (!spec) {
        snprintf(err, errlen, "out of memory");
        json_free(&root);
        return NULL;
    }
    if (parse_root(&c, &root, spec) < 0) {
        spec_free(spec);
        spec = NULL;
    }
    json_free(&root);
    return spec;
}

void spec_free(struct fake_spec *spec)
{
    if (!spec)
        return;
    for (size_t k = 0; k < spec->n_gpus && spec->gpus; k++) {
        free(spec->gpus[k].retired);
        free(spec->gpus[k].procs);
        free(spec->gpus[k].gfx_procs);
    }
    free(spec->gpus);
    free(spec->events);
    free(spec->latency);
    free(spec);
}
