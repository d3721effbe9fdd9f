/* JSON for the `lnk` client (lnk_client.h).
 *
 * Reading: the controller's frames, strictly (what Python's json reads with strict=True and
 * lnk_shared.frames' no-duplicate-keys hook), minus what no frame holds: one object, nothing
 * before or after it; objects, arrays, strings with every escape (\u surrogate pairs joined, a
 * lone surrogate kept), integers, true, false, null. Refused: floats, NaN and Infinity, an
 * integer past 64 bits, a duplicate key, nesting past JSON_MAX_DEPTH, bytes that are not
 * UTF-8. The controller is root and trusted, but a bug there must not become an overflow here:
 * every read is bounded by the frame's end, and every allocation is checked.
 *
 * Writing: ASCII only, \uXXXX (lowercase hex) for everything else, exactly as Python's
 * json.dumps (and the Python client's `_json.encode_basestring_ascii`) writes: the request is
 * then the same bytes whichever client sends it, and no byte of it depends on the reader's
 * idea of UTF-8.
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- writing JSON ------------------------------------------------------------------------ */

static void put_escaped(struct text *t, long code) {
    static const char hex[] = "0123456789abcdef";
    char out[12];
    size_t n = 0;
    if (code >= 0x10000) { /* a surrogate pair, as Python writes it */
        long v = code - 0x10000;
        long pair[2] = {0xD800 | (v >> 10), 0xDC00 | (v & 0x3FF)};
        for (int i = 0; i < 2; i++) {
            out[n++] = '\\';
            out[n++] = 'u';
            for (int shift = 12; shift >= 0; shift -= 4)
                out[n++] = hex[(pair[i] >> shift) & 0xF];
        }
        text_bytes(t, out, n);
        return;
    }
    out[n++] = '\\';
    switch (code) {
    case '"':
    case '\\':
        out[n++] = (char)code;
        break;
    case '\b':
        out[n++] = 'b';
        break;
    case '\f':
        out[n++] = 'f';
        break;
    case '\n':
        out[n++] = 'n';
        break;
    case '\r':
        out[n++] = 'r';
        break;
    case '\t':
        out[n++] = 't';
        break;
    default:
        out[n++] = 'u';
        for (int shift = 12; shift >= 0; shift -= 4)
            out[n++] = hex[(code >> shift) & 0xF];
    }
    text_bytes(t, out, n);
}

static void put_string(struct text *t, const char *data, size_t length, bool wtf8) {
    text_bytes(t, "\"", 1);
    size_t at = 0;
    while (at < length) {
        size_t start = at; /* a run of plain ASCII goes in one piece */
        while (at < length && data[at] >= ' ' && data[at] <= '~' && data[at] != '"' &&
               data[at] != '\\')
            at++;
        text_bytes(t, data + start, at - start);
        if (at < length)
            put_escaped(t, next_char(data, length, &at, wtf8));
    }
    text_bytes(t, "\"", 1);
}

void json_put_bytes(struct text *t, const char *data, size_t length) {
    put_string(t, data, length, false);
}

void json_put_wtf8(struct text *t, const char *data, size_t length) {
    put_string(t, data, length, true);
}

/* --- reading JSON ------------------------------------------------------------------------ */

struct reader {
    const unsigned char *at, *end;
    const char *why;
    int flags;     /* JSON_NUMBERS, JSON_LAST_WINS (json_parse_value) */
    int max_depth; /* JSON_MAX_DEPTH for a frame, JSON_VALUE_MAX_DEPTH for a value */
};

static int refuse(struct reader *r, const char *why) {
    r->why = why;
    return -1;
}

static void skip_space(struct reader *r) {
    while (r->at < r->end && (*r->at == ' ' || *r->at == '\t' || *r->at == '\n' || *r->at == '\r'))
        r->at++;
}

static int hex4(const unsigned char *s, long *out) {
    long value = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit < 0)
            return -1;
        value = value * 16 + digit;
    }
    *out = value;
    return 0;
}

static int parse_string(struct reader *r, struct json_value *out) {
    r->at++; /* the opening quote */
    const unsigned char *scan = r->at;
    while (scan < r->end && *scan != '"') /* its end first: the text is at most this long */
        scan += (*scan == '\\' && scan + 1 < r->end) ? 2 : 1;
    if (scan >= r->end)
        return refuse(r, "a string without its closing quote");
    out->kind = JSON_STRING;
    out->text = malloc((size_t)(scan - r->at) + 1);
    if (out->text == NULL)
        out_of_memory();
    size_t n = 0;
    while (r->at < scan) {
        unsigned char c = *r->at;
        if (c < 0x20)
            return refuse(r, "a control character in a string");
        if (c != '\\') {
            out->text[n++] = (char)c; /* UTF-8 already checked for the whole frame */
            r->at++;
            continue;
        }
        unsigned char e = r->at[1]; /* the scan above left an escape whole before `scan` */
        r->at += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e != '\0' && simple != NULL) {
            out->text[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        long code;
        if (e != 'u' || scan - r->at < 4 || hex4(r->at, &code) != 0)
            return refuse(r, "an invalid escape in a string");
        r->at += 4;
        long low;
        if (code >= 0xD800 && code <= 0xDBFF && scan - r->at >= 6 && r->at[0] == '\\' &&
            r->at[1] == 'u' && hex4(r->at + 2, &low) == 0 && low >= 0xDC00 && low <= 0xDFFF) {
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            r->at += 6;
        }
        n += put_code_point(out->text + n, code); /* at most the 6 or 12 bytes it was read from */
    }
    r->at++; /* the closing quote */
    out->text[n] = '\0';
    out->length = n;
    return 0;
}

/* Python's json number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?, kept as its text. */
static int parse_number_text(struct reader *r, struct json_value *out) {
    const unsigned char *start = r->at;
    if (r->at < r->end && *r->at == '-')
        r->at++;
    if ((size_t)(r->end - r->at) >= 8 && memcmp(r->at, "Infinity", 8) == 0)
        r->at += 8;
    else {
        if (r->at >= r->end || *r->at < '0' || *r->at > '9')
            return refuse(r, "not JSON");
        if (*r->at == '0')
            r->at++;
        else
            while (r->at < r->end && *r->at >= '0' && *r->at <= '9')
                r->at++;
        if (r->at + 1 < r->end && *r->at == '.' && r->at[1] >= '0' && r->at[1] <= '9') {
            r->at++;
            while (r->at < r->end && *r->at >= '0' && *r->at <= '9')
                r->at++;
        }
        const unsigned char *e = r->at;
        if (e < r->end && (*e == 'e' || *e == 'E')) {
            e++;
            if (e < r->end && (*e == '+' || *e == '-'))
                e++;
            if (e < r->end && *e >= '0' && *e <= '9') {
                while (e < r->end && *e >= '0' && *e <= '9')
                    e++;
                r->at = e;
            }
        }
    }
    out->kind = JSON_NUMBER;
    out->length = (size_t)(r->at - start);
    out->text = malloc(out->length + 1);
    if (out->text == NULL)
        out_of_memory();
    memcpy(out->text, start, out->length);
    out->text[out->length] = '\0';
    return 0;
}

static int parse_integer(struct reader *r, struct json_value *out) {
    if (r->flags & JSON_NUMBERS)
        return parse_number_text(r, out);
    bool negative = *r->at == '-';
    if (negative)
        r->at++;
    if (r->at >= r->end || *r->at < '0' || *r->at > '9')
        return refuse(r, "not JSON");
    if (*r->at == '0' && r->at + 1 < r->end && r->at[1] >= '0' && r->at[1] <= '9')
        return refuse(r, "a number with a leading zero");
    long long value = 0;
    while (r->at < r->end && *r->at >= '0' && *r->at <= '9') {
        int digit = *r->at++ - '0';
        if (value > (LLONG_MAX - digit) / 10)
            return refuse(r, "an integer past 64 bits");
        value = value * 10 + digit;
    }
    if (r->at < r->end && (*r->at == '.' || *r->at == 'e' || *r->at == 'E'))
        return refuse(r, "a number that is not an integer");
    out->kind = JSON_INT;
    out->integer = negative ? -value : value;
    return 0;
}

static int parse_literal(struct reader *r, const char *word, enum json_kind kind,
                         struct json_value *out) {
    size_t length = strlen(word);
    if ((size_t)(r->end - r->at) < length || memcmp(r->at, word, length) != 0)
        return refuse(r, "not JSON");
    r->at += length;
    out->kind = kind;
    return 0;
}

/* A new, zeroed entry at the end of `container`'s items (counted before it is filled, so a
   half-parsed entry is freed with its container). */
static struct json_value *append_item(struct json_value *container, size_t *capacity) {
    if (container->count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 8;
        if (grown > SIZE_MAX / sizeof *container->items)
            out_of_memory();
        struct json_value *items = realloc(container->items, grown * sizeof *items);
        if (items == NULL)
            out_of_memory();
        container->items = items;
        *capacity = grown;
    }
    struct json_value *item = &container->items[container->count++];
    memset(item, 0, sizeof *item);
    return item;
}

static int compare_keys(const void *a, const void *b) {
    const struct json_value *x = *(const struct json_value *const *)a;
    const struct json_value *y = *(const struct json_value *const *)b;
    if (x->length != y->length)
        return x->length < y->length ? -1 : 1;
    return memcmp(x->text, y->text, x->length);
}

/* A key given twice is refused, not "last one wins" (lnk_shared.frames.no_duplicate_keys):
   sorted, so a frame of many keys costs n log n, not n squared. */
static int check_unique_keys(struct reader *r, const struct json_value *object) {
    size_t members = object->count / 2;
    if (members < 2)
        return 0;
    const struct json_value **keys = malloc(members * sizeof *keys);
    if (keys == NULL)
        out_of_memory();
    for (size_t i = 0; i < members; i++)
        keys[i] = &object->items[2 * i];
    qsort(keys, members, sizeof *keys, compare_keys);
    int result = 0;
    for (size_t i = 1; i < members && result == 0; i++)
        if (compare_keys(&keys[i - 1], &keys[i]) == 0)
            result = refuse(r, "a duplicate key");
    free(keys);
    return result;
}

static int parse_value(struct reader *r, struct json_value *out, int depth);

static int parse_container(struct reader *r, struct json_value *out, int depth) {
    bool object = *r->at == '{';
    if (depth >= r->max_depth)
        return refuse(r, "arrays and objects nested too deep");
    out->kind = object ? JSON_OBJECT : JSON_ARRAY;
    r->at++;
    skip_space(r);
    size_t capacity = 0;
    char close = object ? '}' : ']';
    if (r->at < r->end && *r->at == close) {
        r->at++;
        return 0;
    }
    for (;;) {
        if (object) {
            if (r->at >= r->end || *r->at != '"')
                return refuse(r, "an object key that is not a string");
            if (parse_string(r, append_item(out, &capacity)) != 0)
                return -1;
            skip_space(r);
            if (r->at >= r->end || *r->at != ':')
                return refuse(r, "an object key without ':'");
            r->at++;
            skip_space(r);
        }
        if (parse_value(r, append_item(out, &capacity), depth + 1) != 0)
            return -1;
        skip_space(r);
        if (r->at < r->end && *r->at == ',') {
            r->at++;
            skip_space(r);
            continue;
        }
        if (r->at < r->end && *r->at == close) {
            r->at++;
            return object && !(r->flags & JSON_LAST_WINS) ? check_unique_keys(r, out) : 0;
        }
        return refuse(r, object ? "an object without its '}'" : "an array without its ']'");
    }
}

static int parse_value(struct reader *r, struct json_value *out, int depth) {
    if (r->at >= r->end)
        return refuse(r, "not JSON");
    switch (*r->at) {
    case '{':
    case '[':
        return parse_container(r, out, depth);
    case '"':
        return parse_string(r, out);
    case 't':
        return parse_literal(r, "true", JSON_TRUE, out);
    case 'f':
        return parse_literal(r, "false", JSON_FALSE, out);
    case 'n':
        return parse_literal(r, "null", JSON_NULL, out);
    case 'N':
        if (r->flags & JSON_NUMBERS) { /* Python's json reads NaN and Infinity by default */
            if (parse_literal(r, "NaN", JSON_NUMBER, out) != 0)
                return -1;
            out->text = strdup("NaN");
            if (out->text == NULL)
                out_of_memory();
            out->length = 3;
            return 0;
        }
        return refuse(r, "not JSON");
    default:
        return parse_integer(r, out);
    }
}

int json_parse(const char *data, size_t length, struct json_value *out, const char **why) {
    memset(out, 0, sizeof *out);
    if (!utf8_valid(data, length)) {
        *why = "a frame that is not UTF-8";
        return -1;
    }
    const unsigned char *s = (const unsigned char *)data;
    struct reader r = {s, s + length, NULL, 0, JSON_MAX_DEPTH};
    /* Like the Python client's scanner: the object starts at the first byte. */
    int result = r.at < r.end && *r.at == '{' ? parse_value(&r, out, 0)
                                              : refuse(&r, "a frame that is not a JSON object");
    if (result == 0 && r.at != r.end)
        result = refuse(&r, "bytes after the frame's object");
    if (result != 0) {
        json_free(out);
        *why = r.why;
    }
    return result;
}

int json_parse_value(const char *data, size_t length, struct json_value *out, const char **why,
                     int flags) {
    memset(out, 0, sizeof *out);
    if (!utf8_valid(data, length)) {
        *why = "bytes that are not UTF-8";
        return -1;
    }
    const unsigned char *s = (const unsigned char *)data;
    struct reader r = {s, s + length, NULL, flags | JSON_NUMBERS, JSON_VALUE_MAX_DEPTH};
    skip_space(&r);
    int result = parse_value(&r, out, 0);
    skip_space(&r);
    if (result == 0 && r.at != r.end)
        result = refuse(&r, "more after the value");
    if (result != 0) {
        json_free(out);
        *why = r.why;
    }
    return result;
}

void json_free(struct json_value *value) {
    for (size_t i = 0; i < value->count; i++)
        json_free(&value->items[i]);
    free(value->items);
    free(value->text);
    memset(value, 0, sizeof *value);
}

const struct json_value *json_get(const struct json_value *object, const char *key) {
    if (object == NULL || object->kind != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i + 1 < object->count; i += 2)
        if (json_is(&object->items[i], key))
            return &object->items[i + 1];
    return NULL;
}

bool json_is(const struct json_value *value, const char *s) {
    size_t length = strlen(s);
    return value != NULL && value->kind == JSON_STRING && value->length == length &&
           memcmp(value->text, s, length) == 0;
}

void text_repr(struct text *t, const struct json_value *value) {
    if (value == NULL || value->kind == JSON_NULL) {
        text_str(t, "None");
        return;
    }
    switch (value->kind) {
    case JSON_TRUE:
        text_str(t, "True");
        return;
    case JSON_FALSE:
        text_str(t, "False");
        return;
    case JSON_INT:
        text_format(t, "%lld", value->integer);
        return;
    case JSON_NUMBER:
        text_str(t, value->text);
        return;
    case JSON_STRING:
        text_repr_string(t, value->text, value->length);
        return;
    default:
        break;
    }
    bool object = value->kind == JSON_OBJECT;
    text_str(t, object ? "{" : "[");
    for (size_t i = 0; i < value->count; i++) {
        if (i > 0)
            text_str(t, object && i % 2 == 1 ? ": " : ", ");
        text_repr(t, &value->items[i]);
    }
    text_str(t, object ? "}" : "]");
}
