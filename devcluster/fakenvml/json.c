/*
 * Recursive-descent JSON parser (RFC 8259) for the fake NVML spec file.
 * See json.h for why this exists.  Errors carry a byte offset plus
 * line/column so that a broken test fixture is easy to locate.
 */
#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deep nesting would only come from a broken or hostile file; a limit keeps
 * the recursion from overflowing the stack of whatever process loaded us. */
#define JSON_MAX_DEPTH 64

typedef struct {
    const char *text;
    size_t len;
    size_t pos;
    int depth;
    json_error *err;
} parser;

static int fail(parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Record the first error at the current position (line/column computed
 * lazily here: errors are rare, so no need to track lines while parsing). */
static int fail(parser *p, const char *fmt, ...)
{
    json_error *e = p->err;
    size_t pos = p->pos < p->len ? p->pos : p->len;
    va_list ap;

    e->offset = pos;
    e->line = 1;
    e->column = 1;
    for (size_t k = 0; k < pos; k++) {
        if (p->text[k] == '\n') {
            e->line++;
            e->column = 1;
        } else {
            e->column++;
        }
    }
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int peek(parser *p)
{
    return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1;
}

static int parse_value(parser *p, json_value *out);

static int match_literal(parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return fail(p, "invalid literal (expected '%s')", word);
    p->pos += n;
    return 0;
}

/* ---- strings ---------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
} strbuf;

static int sb_put(strbuf *sb, char c)
{
    if (sb->len + 1 >= sb->cap) {
        size_t cap = sb->cap ? sb->cap * 2 : 32;
        char *nb = realloc(sb->buf, cap);
        if (!nb)
            return -1;
        sb->buf = nb;
        sb->cap = cap;
    }
    sb->buf[sb->len++] = c;
    sb->buf[sb->len] = '\0';
    return 0;
}

static int sb_put_utf8(strbuf *sb, unsigned long cp)
{
    int rc = 0;
    if (cp < 0x80) {
        rc |= sb_put(sb, (char)cp);
    } else if (cp < 0x800) {
        rc |= sb_put(sb, (char)(0xC0 | (cp >> 6)));
        rc |= sb_put(sb, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        rc |= sb_put(sb, (char)(0xE0 | (cp >> 12)));
        rc |= sb_put(sb, (char)(0x80 | ((cp >> 6) & 0x3F)));
        rc |= sb_put(sb, (char)(0x80 | (cp & 0x3F)));
    } else {
        rc |= sb_put(sb, (char)(0xF0 | (cp >> 18)));
        rc |= sb_put(sb, (char)(0x80 | ((cp >> 12) & 0x3F)));
        rc |= sb_put(sb, (char)(0x80 | ((cp >> 6) & 0x3F)));
        rc |= sb_put(sb, (char)(0x80 | (cp & 0x3F)));
    }
    return rc;
}

static int read_hex4(parser *p, unsigned long *out)
{
    unsigned long v = 0;
    if (p->len - p->pos < 4)
        return fail(p, "truncated \\u escape");
    for (int k = 0; k < 4; k++) {
        char c = p->text[p->pos + k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned long)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned long)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned long)(c - 'A' + 10);
        else
            return fail(p, "invalid hex digit in \\u escape");
    }
    p->pos += 4;
    *out = v;
    return 0;
}

/* \uXXXX, including UTF-16 surrogate pairs (Python's json.dumps emits those
 * for non-BMP characters when ensure_ascii is on, which is its default). */
static int parse_unicode_escape(parser *p, strbuf *sb)
{
    unsigned long cp, lo;
    if (read_hex4(p, &cp) < 0)
        return -1;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (p->len - p->pos < 2 || p->text[p->pos] != '\\' ||
            p->text[p->pos + 1] != 'u')
            return fail(p, "unpaired UTF-16 surrogate");
        p->pos += 2;
        if (read_hex4(p, &lo) < 0)
            return -1;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(p, "invalid UTF-16 low surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return fail(p, "unpaired UTF-16 surrogate");
    }
    return sb_put_utf8(sb, cp) < 0 ? fail(p, "out of memory") : 0;
}

/* Parses a string starting at the opening quote; *out gets a malloc'ed
 * NUL-terminated copy with escapes decoded. */
static int parse_string_raw(parser *p, char **out)
{
    strbuf sb = {0};

    p->pos++; /* opening quote */
    if (sb_put(&sb, '\0') < 0) /* allocate, so "" is a valid pointer too */
        return fail(p, "out of memory");
    sb.len = 0;
    for (;;) {
        int c = peek(p);
        if (c < 0) {
            free(sb.buf);
            return fail(p, "unterminated string");
        }
        if (c == '"') {
            p->pos++;
            *out = sb.buf;
            return 0;
        }
        if (c < 0x20) {
            free(sb.buf);
            return fail(p, "control character in string");
        }
        p->pos++;
        if (c == '\\') {
            int e = peek(p);
            char lit = 0;
            p->pos++;
            switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u':
                if (parse_unicode_escape(p, &sb) < 0) {
                    free(sb.buf);
                    return -1;
                }
                continue;
            default:
                p->pos--;
                free(sb.buf);
                return fail(p, "invalid escape sequence");
            }
            c = lit;
        }
        if (sb_put(&sb, (char)c) < 0) {
            free(sb.buf);
            return fail(p, "out of memory");
        }
    }
}

/* ---- numbers ---------------------------------------------------------- */

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, json_value *out)
{
    size_t start = p->pos;
    int integral = 1;
    char buf[64];
    size_t n;

    if (peek(p) == '-')
        p->pos++;
    if (peek(p) == '0') {
        p->pos++;
    } else if (is_digit(peek(p))) {
        while (is_digit(peek(p)))
            p->pos++;
    } else {
        return fail(p, "invalid number");
    }
    if (peek(p) == '.') {
        integral = 0;
        p->pos++;
        if (!is_digit(peek(p)))
            return fail(p, "digit expected after decimal point");
        while (is_digit(peek(p)))
            p->pos++;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        integral = 0;
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-')
            p->pos++;
        if (!is_digit(peek(p)))
            return fail(p, "digit expected in exponent");
        while (is_digit(peek(p)))
            p->pos++;
    }
    n = p->pos - start;
    if (n >= sizeof(buf)) {
        p->pos = start;
        return fail(p, "number too long");
    }
    memcpy(buf, p->text + start, n);
    buf[n] = '\0';

    out->type = JSON_NUMBER;
    out->d = strtod(buf, NULL);
    out->is_negative = buf[0] == '-';
    if (integral) {
        /* Exact 64-bit value when it fits; otherwise fall back to the
         * double so that range checks further up report it sensibly. */
        errno = 0;
        if (out->is_negative) {
            out->i = strtoll(buf, NULL, 10);
            out->is_int = errno == 0;
            out->u = 0;
        } else {
            out->u = strtoull(buf, NULL, 10);
            out->is_int = errno == 0;
            out->i = out->u <= (unsigned long long)__LONG_LONG_MAX__
                         ? (long long)out->u : __LONG_LONG_MAX__;
        }
    }
    return 0;
}

/* ---- containers ------------------------------------------------------- */

/* Grow the parallel items/keys arrays of a container by one slot. */
static json_value *container_push(json_value *c, size_t *cap, int with_key)
{
    if (c->count == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        json_value *ni = realloc(c->items, ncap * sizeof(*ni));
        if (!ni)
            return NULL;
        c->items = ni;
        if (with_key) {
            char **nk = realloc(c->keys, ncap * sizeof(*nk));
            if (!nk)
                return NULL;
            c->keys = nk;
        }
        *cap = ncap;
    }
    memset(&c->items[c->count], 0, sizeof(json_value));
    return &c->items[c->count];
}

static int parse_array(parser *p, json_value *out)
{
    size_t cap = 0;

    out->type = JSON_ARRAY;
    p->pos++; /* '[' */
    skip_ws(p);
    if (peek(p) == ']') {
        p->pos++;
        return 0;
    }
    for (;;) {
        json_value *slot = container_push(out, &cap, 0);
        if (!slot)
            return fail(p, "out of memory");
        /* Counted first so json_free also releases a half-parsed element. */
        out->count++;
        if (parse_value(p, slot) < 0)
            return -1;
        skip_ws(p);
        if (peek(p) == ',') {
            p->pos++;
            continue;
        }
        if (peek(p) == ']') {
            p->pos++;
            return 0;
        }
        return fail(p, "expected ',' or ']' in array");
    }
}

static int parse_object(parser *p, json_value *out)
{
    size_t cap = 0;

    out->type = JSON_OBJECT;
    p->pos++; /* '{' */
    skip_ws(p);
    if (peek(p) == '}') {
        p->pos++;
        return 0;
    }
    for (;;) {
        json_value *slot;
        char *key = NULL;

        skip_ws(p);
        if (peek(p) != '"')
            return fail(p, "expected string key in object");
        if (parse_string_raw(p, &key) < 0)
            return -1;
        skip_ws(p);
        if (peek(p) != ':') {
            free(key);
            return fail(p, "expected ':' after object key");
        }
        p->pos++;
        slot = container_push(out, &cap, 1);
        if (!slot) {
            free(key);
            return fail(p, "out of memory");
        }
        /* Count the member before parsing its value so that json_free
         * releases the key and a partially built value on error. */
        out->keys[out->count] = key;
        out->count++;
        if (parse_value(p, slot) < 0)
            return -1;
        skip_ws(p);
        if (peek(p) == ',') {
            p->pos++;
            continue;
        }
        if (peek(p) == '}') {
            p->pos++;
            return 0;
        }
        return fail(p, "expected ',' or '}' in object");
    }
}

static int parse_value(parser *p, json_value *out)
{
    int c, rc;

    memset(out, 0, sizeof(*out));
    skip_ws(p);
    c = peek(p);
    if (c < 0)
        return fail(p, "unexpected end of input");
    if (p->depth >= JSON_MAX_DEPTH)
        return fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);

    switch (c) {
    case '{':
        p->depth++;
        rc = parse_object(p, out);
        p->depth--;
        return rc;
    case '[':
        p->depth++;
        rc = parse_array(p, out);
        p->depth--;
        return rc;
    case '"':
        out->type = JSON_STRING;
        return parse_string_raw(p, &out->str);
    case 't':
        out->type = JSON_BOOL;
        out->boolean = 1;
        return match_literal(p, "true");
    case 'f':
        out->type = JSON_BOOL;
        return match_literal(p, "false");
    case 'n':
        out->type = JSON_NULL;
        return match_literal(p, "null");
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p, out);
        return fail(p, "unexpected character '%c'", c);
    }
}

int json_parse(const char *text, size_t len, json_value *out, json_error *err)
{
    parser p = {text, len, 0, 0, err};

    memset(err, 0, sizeof(*err));
    if (parse_value(&p, out) < 0) {
        json_free(out);
        return -1;
    }
    skip_ws(&p);
    if (p.pos != p.len) {
        fail(&p, "trailing data after JSON value");
        json_free(out);
        return -1;
    }
    return 0;
}

void json_free(json_value *v)
{
    if (!v)
        return;
    if (v->type == JSON_ARRAY || v->type == JSON_OBJECT) {
        for (size_t k = 0; k < v->count; k++) {
            json_free(&v->items[k]);
            if (v->keys)
                free(v->keys[k]);
        }
        free(v->items);
        free(v->keys);
    }
    free(v->str);
    memset(v, 0, sizeof(*v));
}

const json_value *json_get(const json_value *obj, const char *key)
{
    const json_value *found = NULL;
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    for (size_t k = 0; k < obj->count; k++)
        if (strcmp(obj->keys[k], key) == 0)
            found = &obj->items[k];
    return found;
}

const char *json_type_name(json_type t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}
