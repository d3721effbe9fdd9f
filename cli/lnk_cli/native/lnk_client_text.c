/* Text for the `lnk` client (lnk_client.h): a growing buffer, UTF-8 and WTF-8, and what a
 * person reads (Python's way of printing a str, its repr, the client's one-line messages).
 *
 * Strings are kept as WTF-8 (UTF-8 plus lone surrogates) because that is what a Python str can
 * hold: argv, the environment and file names reach Python with each stray byte as U+DC80-U+DCFF
 * (surrogateescape), and the controller's answers may name such files.
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REPLACEMENT_ESCAPE 0xDC00 /* surrogateescape: a stray byte B becomes U+DC00+B */

void out_of_memory(void) {
    static const char message[] = "lnk: out of memory\n";
    ssize_t ignored = write(2, message, sizeof message - 1);
    (void)ignored; /* nothing else to tell, and nowhere else to tell it */
    _exit(EXIT_RUN_ERROR);
}

void text_bytes(struct text *t, const char *data, size_t length) {
    if (length > SIZE_MAX / 2 - t->length)
        out_of_memory();
    if (t->length + length + 1 > t->capacity) {
        size_t capacity = t->capacity ? t->capacity : 256;
        while (capacity < t->length + length + 1)
            capacity *= 2;
        char *grown = realloc(t->data, capacity);
        if (grown == NULL)
            out_of_memory();
        t->data = grown;
        t->capacity = capacity;
    }
    if (length > 0)
        memcpy(t->data + t->length, data, length);
    t->length += length;
    t->data[t->length] = '\0'; /* always a C string too, for messages */
}

void text_str(struct text *t, const char *s) { text_bytes(t, s, strlen(s)); }

void text_free(struct text *t) {
    free(t->data);
    t->data = NULL;
    t->length = t->capacity = 0;
}

void text_format(struct text *t, const char *format, ...) {
    char buffer[128]; /* numbers, escapes and short fixed words only */
    va_list args;
    va_start(args, format);
    int n = vsnprintf(buffer, sizeof buffer, format, args);
    va_end(args);
    if (n < 0 || (size_t)n >= sizeof buffer)
        out_of_memory(); /* cannot happen with this file's formats */
    text_bytes(t, buffer, (size_t)n);
}

/* --- UTF-8 ------------------------------------------------------------------------------- */

static bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* The code point of the UTF-8 sequence at `s` (of at most `n` bytes) and its length in
   `*used`; -1 if no valid sequence starts there. Strict (no overlong forms, nothing past
   U+10FFFF); surrogates (ED A0-BF xx) only with `wtf8`. */
static long next_code_point(const unsigned char *s, size_t n, size_t *used, bool wtf8) {
    if (n == 0)
        return -1;
    unsigned char c = s[0];
    if (c < 0x80) {
        *used = 1;
        return c;
    }
    size_t length;
    long code;
    unsigned char low = 0x80, high = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) {
        length = 2;
        code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        length = 3;
        code = c & 0x0F;
        if (c == 0xE0)
            low = 0xA0;
        else if (c == 0xED && !wtf8)
            high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        length = 4;
        code = c & 0x07;
        if (c == 0xF0)
            low = 0x90;
        else if (c == 0xF4)
            high = 0x8F;
    } else {
        return -1;
    }
    if (n < length || s[1] < low || s[1] > high)
        return -1;
    for (size_t i = 1; i < length; i++) {
        if (!continuation(s[i]))
            return -1;
        code = (code << 6) | (s[i] & 0x3F);
    }
    *used = length;
    return code;
}

bool utf8_valid(const char *data, size_t length) {
    const unsigned char *s = (const unsigned char *)data;
    for (size_t at = 0, used = 0; at < length; at += used)
        if (next_code_point(s + at, length - at, &used, false) < 0)
            return false;
    return true;
}

bool is_surrogate(long code) { return code >= 0xD800 && code <= 0xDFFF; }

size_t put_code_point(char *out, long code) {
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

long next_char(const char *data, size_t length, size_t *at, bool wtf8) {
    const unsigned char *s = (const unsigned char *)data + *at;
    size_t used = 1;
    long code = next_code_point(s, length - *at, &used, wtf8);
    if (code < 0) {
        code = REPLACEMENT_ESCAPE + s[0];
        used = 1;
    }
    *at += used;
    return code;
}

/* --- text for people --------------------------------------------------------------------- */

static void printable_text(struct text *t, const char *data, size_t length, bool wtf8) {
    size_t at = 0;
    while (at < length) {
        size_t start = at;
        long code = next_char(data, length, &at, wtf8);
        if (is_surrogate(code))
            text_format(t, "\\u%04lx", code);
        else
            text_bytes(t, data + start, at - start);
    }
}

void text_printable(struct text *t, const char *data, size_t length) {
    printable_text(t, data, length, true);
}

void text_printable_bytes(struct text *t, const char *data, size_t length) {
    printable_text(t, data, length, false);
}

char *wtf8_file_name(const char *data, size_t length) {
    char *name = malloc(length + 1);
    if (name == NULL)
        out_of_memory();
    size_t n = 0, at = 0;
    while (at < length) {
        size_t start = at;
        long code = next_char(data, length, &at, true);
        if (code >= REPLACEMENT_ESCAPE + 0x80 && code <= REPLACEMENT_ESCAPE + 0xFF) {
            name[n++] = (char)(code - REPLACEMENT_ESCAPE);
        } else if (code == 0 || is_surrogate(code)) {
            free(name);
            errno = EILSEQ;
            return NULL;
        } else {
            memcpy(name + n, data + start, at - start);
            n += at - start;
        }
    }
    name[n] = '\0';
    return name;
}

/* Python's str.isprintable, for what this client may quote: exact for ASCII and Latin-1;
   past those only the surrogates, the line and paragraph separators and the BOM count as not
   printable (the full rule needs Unicode's tables, for text a trusted controller never
   sends). */
static bool printable(long code) {
    if (code < 0x100)
        return (code >= 0x20 && code < 0x7F) || (code >= 0xA1 && code != 0xAD);
    return !is_surrogate(code) && code != 0x2028 && code != 0x2029 && code != 0xFEFF;
}

void text_repr_string(struct text *t, const char *data, size_t length) {
    bool single = memchr(data, '\'', length) != NULL, dbl = memchr(data, '"', length) != NULL;
    char quote = single && !dbl ? '"' : '\'';
    text_bytes(t, &quote, 1);
    size_t at = 0;
    while (at < length) {
        size_t start = at;
        long code = next_char(data, length, &at, true);
        if (code == quote || code == '\\')
            text_format(t, "\\%c", (char)code);
        else if (code == '\t' || code == '\n' || code == '\r')
            text_str(t, code == '\t' ? "\\t" : code == '\n' ? "\\n" : "\\r");
        else if (printable(code))
            text_bytes(t, data + start, at - start);
        else
            text_format(t, code < 0x100 ? "\\x%02lx" : code < 0x10000 ? "\\u%04lx" : "\\U%08lx",
                        code);
    }
    text_bytes(t, &quote, 1);
}

size_t wtf8_prefix(const char *data, size_t length, size_t chars) {
    size_t at = 0;
    for (size_t i = 0; i < chars && at < length; i++)
        next_char(data, length, &at, true);
    return at;
}

/* --- messages ---------------------------------------------------------------------------- */

void write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* stderr gone: Python's BrokenPipeError ends quietly too */
        data += n;
        length -= (size_t)n;
    }
}

struct text message_start(void) {
    struct text m = {0};
    text_str(&m, "lnk: ");
    return m;
}

void message_exit(struct text *m, int code) {
    text_str(m, "\n");
    write_all(2, m->data, m->length);
    exit(code);
}

void fail(int code, const char *what) {
    struct text m = message_start();
    text_str(&m, what);
    message_exit(&m, code);
}
