/* JSON values written as Python writes them (lnk_client.h), for `lnk bridge`: a call's body as
 * proof_client.encode_body writes its arguments (json.dumps(separators=(",", ":"),
 * sort_keys=True, ensure_ascii=False)) and a bridge's answer as bridge_commands prints it
 * (json.dumps(indent=2, ensure_ascii=False)), from values json_parse_value read.
 *
 * Numbers are what Python's json.loads makes of their text, written back: an integer as int()
 * gives it (-0 is 0; more than INT_MAX_DIGITS digits is refused, as Python's limit refuses it),
 * anything with a fraction or an exponent as repr(float(text)) (the shortest text that reads
 * back as the same double; 1E400 is Infinity), NaN and Infinity as they are. Strings are
 * UTF-8 with only '"', '\' and the control characters escaped; one holding a lone surrogate
 * cannot be written as UTF-8 (Python's encode fails on it) and is refused, by name.
 * An object read with JSON_LAST_WINS keeps a duplicate key's last value, as a dict does.
 *
 * Where it may differ from Python: for a double just above a power of two, the shortest text
 * is searched digit count by digit count from printf's correctly rounded one, which can be one
 * digit longer than Python's dtoa picks (the same double either way).
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INT_MAX_DIGITS 4300 /* sys.get_int_max_str_digits(): Python refuses a longer int text */
#define DOUBLE_DIGITS 17    /* every double reads back from 17 significant digits */
/* Python's repr: a fixed point while the point is within -4 < decpt <= 16, else an exponent */
#define REPR_FIXED_LOW (-4)
#define REPR_FIXED_HIGH 16

static int refuse_value(const char **why, const char *what) {
    *why = what;
    return -1;
}

/* The fewest significant digits that read back as x (x finite, >= 0), as Python's repr finds
 * them (David Gay's shortest mode): into mantissa (n digits, trailing zeros kept) with the
 * point's place decpt. printf rounds correctly to p digits, but where that rounding reads back
 * as another double, the p-digit number one unit away may still read back as x: 2**-24 is
 * 5.960464477539063e-08 in Python, whose correctly rounded 16 digits (...062) are another
 * double's. Both neighbours cannot read back as x where the nearer one did not. */
static size_t shortest_digits(double x, char mantissa[DOUBLE_DIGITS + 2], int *decpt) {
    char buf[48], candidate[48];
    for (int digits = 1; digits <= DOUBLE_DIGITS; digits++) {
        snprintf(buf, sizeof buf, "%.*e", digits - 1, x); /* d[.ddd]e[+-]NN */
        unsigned long long m = 0;
        const char *p = buf;
        for (; *p != 'e'; p++)
            if (*p != '.')
                m = m * 10 + (unsigned long long)(*p - '0');
        int exponent = atoi(p + 1) - (digits - 1); /* x is about m * 10**exponent */
        unsigned long long tried[3] = {m, m + 1, m - 1};
        for (int i = 0; i < (digits == DOUBLE_DIGITS ? 1 : 3); i++) {
            if (i == 2 && m <= 1)
                break;
            snprintf(candidate, sizeof candidate, "%llue%d", tried[i], exponent);
            if (strtod(candidate, NULL) != x)
                continue;
            int n = snprintf(mantissa, DOUBLE_DIGITS + 2, "%llu", tried[i]);
            *decpt = exponent + n;
            return (size_t)n;
        }
    }
    mantissa[0] = '0'; /* not reached: 17 digits always read back */
    *decpt = 1;
    return 1;
}

/* repr(x) for a finite double, as Python's float_repr_style "short" writes it. */
static void put_double(struct text *t, double x) {
    if (signbit(x)) {
        text_str(t, "-");
        x = -x;
    }
    char mantissa[DOUBLE_DIGITS + 2];
    int decpt;
    size_t n = shortest_digits(x, mantissa, &decpt);
    while (n > 1 && mantissa[n - 1] == '0') /* 0e+00 stays "0" */
        n--;
    if (decpt > REPR_FIXED_LOW && decpt <= REPR_FIXED_HIGH) {
        if (decpt <= 0) {
            text_str(t, "0.");
            for (int i = decpt; i < 0; i++)
                text_str(t, "0");
            text_bytes(t, mantissa, n);
        } else if ((size_t)decpt >= n) {
            text_bytes(t, mantissa, n);
            for (size_t i = n; i < (size_t)decpt; i++)
                text_str(t, "0");
            text_str(t, ".0");
        } else {
            text_bytes(t, mantissa, (size_t)decpt);
            text_str(t, ".");
            text_bytes(t, mantissa + decpt, n - (size_t)decpt);
        }
        return;
    }
    text_bytes(t, mantissa, 1);
    if (n > 1) {
        text_str(t, ".");
        text_bytes(t, mantissa + 1, n - 1);
    }
    int exponent = decpt - 1;
    text_format(t, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
}

static int put_number(struct text *t, const struct json_value *v, const char **why) {
    const char *s = v->text;
    if (strcmp(s, "NaN") == 0 || strcmp(s, "Infinity") == 0 || strcmp(s, "-Infinity") == 0) {
        text_str(t, s);
        return 0;
    }
    if (strpbrk(s, ".eE") == NULL) { /* int(text) */
        size_t digits = v->length - (s[0] == '-');
        if (digits > INT_MAX_DIGITS)
            return refuse_value(why, "an integer of more than 4300 digits (Python's limit)");
        text_str(t, strcmp(s, "-0") == 0 ? "0" : s);
        return 0;
    }
    double x = strtod(s, NULL); /* the C locale: '.' is the point */
    if (isinf(x))
        text_str(t, x < 0 ? "-Infinity" : "Infinity");
    else
        put_double(t, x);
    return 0;
}

/* A string as ensure_ascii=False writes it: UTF-8, only '"', '\' and controls escaped. */
static int put_unicode(struct text *t, const char *data, size_t length, const char **why) {
    static const char hex[] = "0123456789abcdef";
    text_str(t, "\"");
    size_t at = 0;
    while (at < length) {
        size_t start = at;
        long code = next_char(data, length, &at, true);
        if (is_surrogate(code))
            return refuse_value(why, "a string with a lone surrogate (not UTF-8)");
        const char *escape = code == '"'    ? "\\\""
                             : code == '\\' ? "\\\\"
                             : code == '\n' ? "\\n"
                             : code == '\r' ? "\\r"
                             : code == '\t' ? "\\t"
                             : code == '\b' ? "\\b"
                             : code == '\f' ? "\\f"
                                            : NULL;
        if (escape != NULL)
            text_str(t, escape);
        else if (code < 0x20) {
            char out[6] = {'\\', 'u', '0', '0', hex[code >> 4], hex[code & 15]};
            text_bytes(t, out, sizeof out);
        } else
            text_bytes(t, data + start, at - start);
    }
    text_str(t, "\"");
    return 0;
}

struct member {
    const struct json_value *key, *value;
    size_t order;
};

/* Keys by code point (their UTF-8 bytes in order), a duplicate's later value after its first. */
static int compare_members(const void *a, const void *b) {
    const struct member *x = a, *y = b;
    size_t shorter = x->key->length < y->key->length ? x->key->length : y->key->length;
    int c = memcmp(x->key->text, y->key->text, shorter);
    if (c != 0)
        return c;
    if (x->key->length != y->key->length)
        return x->key->length < y->key->length ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

int json_put_canonical(struct text *t, const struct json_value *v, const char **why) {
    switch (v->kind) {
    case JSON_NULL:
        text_str(t, "null");
        return 0;
    case JSON_TRUE:
        text_str(t, "true");
        return 0;
    case JSON_FALSE:
        text_str(t, "false");
        return 0;
    case JSON_INT:
        text_format(t, "%lld", v->integer);
        return 0;
    case JSON_NUMBER:
        return put_number(t, v, why);
    case JSON_STRING:
        return put_unicode(t, v->text, v->length, why);
    case JSON_ARRAY:
        text_str(t, "[");
        for (size_t i = 0; i < v->count; i++) {
            if (i > 0)
                text_str(t, ",");
            if (json_put_canonical(t, &v->items[i], why) != 0)
                return -1;
        }
        text_str(t, "]");
        return 0;
    case JSON_OBJECT:
        break;
    }
    size_t members = v->count / 2;
    struct member *sorted = calloc(members ? members : 1, sizeof *sorted);
    if (sorted == NULL)
        out_of_memory();
    for (size_t i = 0; i < members; i++)
        sorted[i] = (struct member){&v->items[2 * i], &v->items[2 * i + 1], i};
    qsort(sorted, members, sizeof *sorted, compare_members);
    text_str(t, "{");
    bool first = true;
    int result = 0;
    for (size_t i = 0; i < members && result == 0; i++) {
        if (i + 1 < members && compare_members(&(struct member){sorted[i].key, NULL, 0},
                                                &(struct member){sorted[i + 1].key, NULL, 0}) == 0)
            continue; /* a later value of the same key holds (a dict's) */
        if (!first)
            text_str(t, ",");
        first = false;
        result = put_unicode(t, sorted[i].key->text, sorted[i].key->length, why);
        if (result == 0) {
            text_str(t, ":");
            result = json_put_canonical(t, sorted[i].value, why);
        }
    }
    free(sorted);
    if (result == 0)
        text_str(t, "}");
    return result;
}

static void indent(struct text *t, int level) {
    text_str(t, "\n");
    for (int i = 0; i < level; i++)
        text_str(t, "  ");
}

int json_put_pretty(struct text *t, const struct json_value *v, int level, const char **why) {
    if (v->kind != JSON_ARRAY && v->kind != JSON_OBJECT)
        return json_put_canonical(t, v, why);
    bool object = v->kind == JSON_OBJECT;
    if (v->count == 0) {
        text_str(t, object ? "{}" : "[]");
        return 0;
    }
    text_str(t, object ? "{" : "[");
    size_t step = object ? 2 : 1;
    for (size_t i = 0; i < v->count; i += step) {
        if (i > 0)
            text_str(t, ",");
        indent(t, level + 1);
        if (object) {
            if (put_unicode(t, v->items[i].text, v->items[i].length, why) != 0)
                return -1;
            text_str(t, ": ");
        }
        if (json_put_pretty(t, &v->items[i + step - 1], level + 1, why) != 0)
            return -1;
    }
    indent(t, level);
    text_str(t, object ? "}" : "]");
    return 0;
}
