/*
 * Minimal JSON reader for the fake NVML library.
 *
 * Why our own: the fake must be a single self-contained .so that builds with
 * nothing but gcc and libc, so we cannot depend on a JSON library being
 * installed.  The spec files are small (a few KiB), so a straightforward
 * recursive-descent parser that builds a tree is plenty.
 *
 * Integers are kept exactly (int64 / uint64) rather than as doubles because
 * the spec carries byte counts and 64-bit bitmasks.
 */
#ifndef FAKENVML_JSON_H
#define FAKENVML_JSON_H

#include <stddef.h>

typedef enum {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value {
    json_type type;
    int boolean;              /* JSON_BOOL */
    /* JSON_NUMBER: is_int is set for literals without fraction/exponent that
     * fit in 64 bits; is_negative tells which of i / u is meaningful. */
    int is_int;
    int is_negative;
    long long i;
    unsigned long long u;
    double d;                 /* always set for numbers */
    char *str;                /* JSON_STRING (NUL terminated, UTF-8) */
    size_t count;             /* JSON_ARRAY / JSON_OBJECT element count */
    struct json_value *items; /* array elements, or object member values */
    char **keys;              /* JSON_OBJECT member names, parallel to items */
} json_value;

/* Where and why parsing failed; line/column are 1-based, offset 0-based. */
typedef struct {
    size_t offset;
    unsigned line;
    unsigned column;
    char message[128];
} json_error;

/* Parse `len` bytes of `text` into *out.  Returns 0 on success, -1 on error
 * (then *err is filled and *out holds nothing that needs freeing). */
int json_parse(const char *text, size_t len, json_value *out, json_error *err);

/* Release everything a successful json_parse allocated. */
void json_free(json_value *v);

/* Object member lookup; NULL when absent or when obj is not an object.
 * With duplicate keys the last one wins, like Python's json module. */
const json_value *json_get(const json_value *obj, const char *key);

const char *json_type_name(json_type t);

#endif
