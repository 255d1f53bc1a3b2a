/*
 * In-memory model of the fake NVML spec file (see README.md for the JSON
 * format) and the conversion from parsed JSON to that model.
 *
 * The model is immutable once built: a reload builds a complete new model
 * and swaps it in under the library lock, so an invalid file can never leave
 * half-applied state behind (the brief: "keep the last good state").
 */
#ifndef FAKENVML_SPEC_H
#define FAKENVML_SPEC_H

#include <stddef.h>

/* Limits of the fake, not of NVML.  Device handles live in static tables of
 * these sizes so that they stay valid across reloads (see fakenvml.c). */
#define FAKE_MAX_GPUS 64
#define FAKE_MAX_MIG 16
#define FAKE_MAX_CPUS 4096
#define FAKE_CPU_WORDS (FAKE_MAX_CPUS / 64)

/* NVML_NVLINK_MAX_LINKS in current nvml.h / pynvml 13.x is 36; a Hopper GPU
 * has 18 links, which is the per-device default ("nvlink_count"). */
#define FAKE_NVLINK_MAX_LINKS 36
#define FAKE_NVLINK_ERROR_COUNTERS 5

#define FAKE_NAME_LEN 96   /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define FAKE_UUID_LEN 96   /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define FAKE_SERIAL_LEN 30 /* NVML_DEVICE_SERIAL_BUFFER_SIZE */
#define FAKE_VERSION_LEN 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define FAKE_FABRIC_UUID_LEN 16 /* NVML_GPU_FABRIC_UUID_LEN */
/* A temperature threshold the GPU does not report ("-1" in the spec). */
#define FAKE_THRESHOLD_NONE (-1)

struct fake_pci {
    unsigned domain, bus, device, function;
};

struct fake_mig {
    char uuid[FAKE_UUID_LEN];
    char name[FAKE_NAME_LEN];
    unsigned long long memory_total, memory_used;
    unsigned gpu_instance_id, compute_instance_id;
};

struct fake_process {
    unsigned pid;
    unsigned long long used_memory;
    unsigned gpu_instance_id, compute_instance_id;
    /* "while_alive": listed only while `pid` is a live (non-zombie) process
     * of this host, and its used_memory then adds to the GPU's memory used,
     * as the real driver drops an exited process and frees its memory. */
    int while_alive;
};

struct fake_retired_page {
    unsigned long long address, timestamp;
    unsigned cause; /* nvmlPageRetirementCause_t */
};

struct fake_gpu {
    char name[FAKE_NAME_LEN];
    char uuid[FAKE_UUID_LEN];
    char serial[FAKE_SERIAL_LEN];
    /* nvmlDeviceGetVbiosVersion (NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE 32) */
    char vbios[32];
    unsigned minor;
    struct fake_pci pci;
    unsigned pci_device_id, pci_subsystem_id;

    /* memory_reserved: the driver's own reserve (in v1's "used", v2's
     * "reserved"); memory_used: in use beyond it, by no listed process. */
    unsigned long long memory_total, memory_used, memory_reserved;
    unsigned util_gpu, util_memory;
    unsigned temperature;
    unsigned power_usage, power_limit; /* milliwatts */
    unsigned long long cpu_mask[FAKE_CPU_WORDS];

    unsigned nvlink_count;  /* links that exist on the device */
    unsigned nvlink_active; /* links 0..nvlink_active-1 are up */
    int nvlink_past_last;   /* what a link >= nvlink_count answers */
    struct fake_pci nvlink_remote[FAKE_NVLINK_MAX_LINKS];
    unsigned long long nvlink_errors[FAKE_NVLINK_MAX_LINKS]
                                    [FAKE_NVLINK_ERROR_COUNTERS];

    unsigned mig_current, mig_pending;
    size_t n_mig;
    struct fake_mig mig[FAKE_MAX_MIG];

    int lost;
    unsigned long long clocks_event_reasons;
    unsigned remap_corrected, remap_uncorrected, remap_pending, remap_failure;
    unsigned ecc_current, ecc_pending;
    /* [counterType: volatile=0, aggregate=1][errorType: corrected=0,
     * uncorrected=1], the argument order of nvmlDeviceGetTotalEccErrors. */
    unsigned long long ecc[2][2];

    int retired_supported; /* "retired_pages" key present */
    unsigned retired_pending;
    size_t n_retired;
    struct fake_retired_page *retired;

    size_t n_procs, n_gfx_procs;
    struct fake_process *procs, *gfx_procs;
    unsigned process_list_delay_ms; /* each process-list call sleeps this long */

    unsigned pcie_replay;
    /* PCIe link: current and maximum (of the GPU in this slot) generation
     * and width, and the generation the GPU itself supports. */
    unsigned pcie_gen, pcie_width, pcie_max_gen, pcie_max_width, pcie_gpu_max_gen;

    /* nvmlTemperatureThresholds_t 0..3 (SHUTDOWN, SLOWDOWN, MEM_MAX,
     * GPU_MAX), degrees C; FAKE_THRESHOLD_NONE: not reported. */
    int temp_thresholds[4];
    unsigned memory_temperature;  /* NVML_FI_DEV_MEMORY_TEMP */
    unsigned gpu_recovery_action; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */

    int fabric_supported; /* "fabric" an object: the GPU is on a fabric */
    int fabric_error;     /* "fabric" an error: GetGpuFabricInfo(V) fail with it */
    unsigned fabric_state, fabric_clique_id, fabric_health_mask;
    int fabric_status;    /* nvmlReturn_t */
    unsigned char fabric_cluster_uuid[FAKE_FABRIC_UUID_LEN];

    unsigned long long energy; /* mJ at load time (nvmlDeviceGetTotalEnergyConsumption) */

    /* Calls on this GPU's handles that "lost" would fail with
     * GPU_IS_LOST return query_error instead (0: none), after sleeping
     * query_delay_ms with the library lock released. */
    int query_error;
    unsigned query_delay_ms;
    unsigned clock_graphics, clock_sm, clock_mem, clock_video; /* MHz */
    /* What it answers while the fake libcuda runs work on it (its "load"
     * object; the recorded H200 under a bf16 matmul by default). */
    struct {
        unsigned clock_sm, clock_graphics, power_usage, util_gpu;
        unsigned long long clocks_event_reasons;
    } load;
    unsigned persistence;
    unsigned brand, architecture;
    int cc_major, cc_minor;
    unsigned long long supported_events;
};

struct fake_event {
    unsigned gpu;
    unsigned long long type, data;
    unsigned gpu_instance_id, compute_instance_id;
};

/* A call's time: `name` is an entry point, `selector` its first selecting
 * argument (a threshold or clock type) or -1 for any. */
struct fake_latency {
    char name[64];
    long selector;
    unsigned us;
};

struct fake_spec {
    char driver_version[FAKE_VERSION_LEN];
    char nvml_version[FAKE_VERSION_LEN];
    int cuda_driver_version;
    int init_error; /* nvmlReturn_t for nvmlInit*, 0 = succeed */
    size_t n_gpus;
    struct fake_gpu *gpus;
    size_t n_events;
    struct fake_event *events;
    /* "latency": each call sleeps its time (none: no latency) */
    size_t n_latency;
    struct fake_latency *latency;
    /* CLOCK_MONOTONIC when this version was loaded: the energy counter
     * grows by power_usage from then on. */
    long long loaded_ns;
};

/* Read `path` and build a model.  Returns a malloc'ed spec, or NULL with a
 * one-line reason (including parse position) written into err. */
struct fake_spec *spec_load(const char *path, char *err, size_t errlen);
void spec_free(struct fake_spec *spec);

/* Microseconds a call of entry point `name` sleeps in `spec` (0: none). */
unsigned spec_latency_us(const struct fake_spec *spec, const char *name, long selector);

/* Parse "DDDDDDDD:BB:DD.F" / "DDDD:BB:DD.F" / "BB:DD.F"; 0 on success. */
int fake_parse_pci(const char *s, struct fake_pci *out);

/* The NVML error code table, shared by nvmlErrorString and "init_error". */
const char *fake_error_string(int code);
int fake_error_from_name(const char *name); /* -1 when unknown */

#endif
