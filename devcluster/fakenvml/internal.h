/*
 * Declarations shared by the fake NVML translation units (fakenvml.c for
 * the library core and device queries, events.c for event sets).
 *
 * Types are declared here from NVML's public documentation rather than by
 * including nvml.h: the fake must build on machines without CUDA headers.
 * Only the ABI matters (enums are ints, handles are opaque pointers, and
 * struct layouts match pynvml's ctypes definitions, checked by
 * _Static_assert in the .c files).
 */
#ifndef FAKENVML_INTERNAL_H
#define FAKENVML_INTERNAL_H

#include "spec.h"

/* Everything is compiled with -fvisibility=hidden; only functions marked
 * NVML_API are exported.  devcluster/fakenvml/__init__.py also greps for this
 * marker to learn which entry points are real (the rest get stubs that
 * return NVML_ERROR_NOT_SUPPORTED), so keep "NVML_API <type> nvmlName(" on
 * one line. */
#define NVML_API __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* Lock the library, fail with NVML_ERROR_UNINITIALIZED unless nvmlInit
 * succeeded, and pick up a rewritten spec file.  On NVML_SUCCESS the caller
 * holds the lock and must release it with fake_leave(). */
nvmlReturn_t fake_enter(void);
nvmlReturn_t fake_leave(nvmlReturn_t rc);

/* The current spec; only valid between fake_enter and fake_leave. */
const struct fake_spec *fake_current_spec(void);

/* fake_enter + resolve a physical-GPU handle.  MIG handles get
 * NVML_ERROR_NOT_SUPPORTED, lost or vanished GPUs NVML_ERROR_GPU_IS_LOST.
 * On success the lock is held and *gpu / *index describe the device. */
nvmlReturn_t fake_enter_gpu(nvmlDevice_t device, const struct fake_gpu **gpu,
                            unsigned *index);

/* The stable handle of GPU `index` (what nvmlDeviceGetHandleByIndex hands
 * out); index must be < FAKE_MAX_GPUS. */
nvmlDevice_t fake_gpu_handle(unsigned index);

/* Is the GPU at spec position `position` visible to this process (its
 * device file opens, or no dev dir is set)?  Lock held. */
int fake_gpu_visible(unsigned position);

/* Every entry point starts with LATENCY(selecting argument or -1): the call
 * is `name`'s, and its first fake_enter() sleeps the time the spec's
 * "latency" gives it (none without), without the lock.  An entry point that
 * forwards to another takes the other's time (the innermost name wins). */
void fake_latency(const char *name, long selector);
#define LATENCY(selector) fake_latency(__func__, (selector))

/* What a generated stub returns (see fakenvml.c). */
int fake_stub_result(const void *first_arg);

/* events.c: sleep `ms` milliseconds, EINTR or not (call without the lock). */
void fake_sleep_ms(long long ms);
/* The spec file of this session ("" before the first init). */
const char *fake_spec_path(void);

/* events.c: called with the lock held after a new spec was swapped in. */
void fake_events_spec_changed(size_t n_events);

#endif
