/*
 * json_scan.c: the one pass over a request body from a sandbox (json_scan_module.c makes it
 * lnk_proxy._json_scan.scan(body, max_depth, max_values) -> (code, may_fetch); no Python here)
 *
 * One pass over a request body from a sandbox, before any parser builds a value of it, that
 * tells strict_json whether msgspec's parse of these bytes may be taken as the strict reader's
 * (code 0), or whether the old reader must decide (any other code). It checks, all at once:
 *   - the bytes are one JSON text by RFC 8259, strictly: the grammar (whitespace, literals,
 *     numbers, strings, nothing after the top level), UTF-8 inside strings (no overlong form,
 *     no encoded surrogate, nothing past U+10FFFF; outside strings only ASCII is grammar),
 *     no control character unescaped in a string, every escape one of the nine;
 *   - the top level is an object;
 *   - no object has a key twice, keys compared as the code points they decode to
 *     (`"a"` and `"\u0061"` are the same key);
 *   - no lone surrogate escape (`"\ud800"`: other parsers replace or refuse it);
 *   - containers nest at most max_depth deep (the outermost is 1);
 *   - at most max_values bytes begin a value or a member outside strings (`[` `{` `,` `:`, as
 *     json_shape.structure_within counts them);
 * and sets may_fetch when some string (a key or a value) decodes to exactly one of the names
 * hosted_bodies.FETCH_NAMES lists, so the fetch walk runs only when it could refuse. And it
 * finds where each top-level member named one of hosted_bodies.CONTENT_KEYS (as written, no
 * escape) lies, and whether all of them are plain: no key in them spelt with an escape or
 * one of the fetch names, every `type` an unescaped string of hosted_bodies.PLAIN_TYPES, every
 * number at most 15 characters with no exponent. Plain content is forwarded as these bytes,
 * unparsed (hosted_bodies' docstring says why that is safe): so the screen is an allowlist,
 * and anything it does not know sends the body down the full parse.
 *
 * Why hand-written and not a library: no JSON library we could link reports a key given twice
 * (msgspec, orjson, yyjson and simdjson keep one silently), and this is the trust boundary, so
 * the code that decides must be small enough to read whole: one function per grammar rule, no
 * recursion, no allocation. Its memory is fixed: per open object, at most max_depth of them
 * (<= MAX_LEVELS), a table of the keys seen so far (TABLE_SLOTS slots, a slot per key: a hash
 * and where the key's bytes are, compared again on a hash match). An object with more than
 * MAX_KEYS keys is not judged here (code TOO_MANY_KEYS): the old reader, exact at any size,
 * decides. The tables are static and used with the GIL held (the scan never releases it), so
 * one scan runs at a time; a table slot belongs to the object whose serial number it carries,
 * so opening an object costs no clearing.
 *
 * The scan only ever lets the fast reader accept: every code but OK sends the body to the
 * reader as it was before (strict_json: json_shape's passes and the stdlib reader), whose
 * verdict stands. Its codes name the first thing found, for tests and benches, not for people.
 */
#include "json_scan.h"

#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif


#define TABLE_SLOTS 256 /* per open object; a power of two, twice MAX_KEYS: probes stay short */

typedef struct {
    uint32_t serial; /* the object this slot belongs to (a stale serial: an empty slot) */
    uint32_t hash;
    uint32_t start;  /* the key's bytes between its quotes, as offsets into the body */
    uint32_t length;
} slot_t;

static slot_t tables[MAX_LEVELS][TABLE_SLOTS];
static uint32_t next_serial = 1;

const char *const JSON_SCAN_FETCH_NAMES[] = {"file_id", "file_url", "source", "image_url",
                                             "item_reference"};
#define FETCH_NAMES JSON_SCAN_FETCH_NAMES
#define FETCH_COUNT (sizeof JSON_SCAN_FETCH_NAMES / sizeof JSON_SCAN_FETCH_NAMES[0])
const size_t JSON_SCAN_FETCH_COUNT = FETCH_COUNT;
#define FETCH_LONGEST 14 /* "item_reference" */
#define FETCH_LENGTHS ((1u << 6) | (1u << 7) | (1u << 8) | (1u << 9) | (1u << 14))

const char *const JSON_SCAN_CONTENT_KEYS[] = {"messages", "system", "input", "instructions"};
const size_t JSON_SCAN_CONTENT_COUNT = 4;
const char *const JSON_SCAN_PLAIN_TYPES[] = {
    "text",          "tool_use",        "tool_result",          "thinking",  "redacted_thinking",
    "ephemeral",     "message",         "input_text",           "output_text", "function",
    "function_call", "function_call_output", "reasoning",       "summary_text", "refusal"};
const size_t JSON_SCAN_PLAIN_COUNT =
    sizeof JSON_SCAN_PLAIN_TYPES / sizeof JSON_SCAN_PLAIN_TYPES[0];
#define PLAIN_NUMBER_CHARS 15 /* a number no longer and with no exponent: any parser's double */

typedef struct {
    const unsigned char *body, *p, *end;
    int may_fetch;
    int member;     /* the content key (index) whose top-level value is being read, or -1 */
    int plain;      /* no content member so far holds anything judged (the header says what) */
    int type_value; /* inside content, the key just read is `type`: its value is judged */
    json_span_t *spans;
    int span_count;
} scanner_t;

static const unsigned char *skip_space(const unsigned char *p, const unsigned char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The four hex digits at p (p + 4 <= end checked by the caller), or -1. */
static long hex4(const unsigned char *p) {
    long value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_value(p[i]);
        if (digit < 0) return -1;
        value = value * 16 + digit;
    }
    return value;
}

/* How many bytes the UTF-8 sequence at p takes (p < end), or 0 when it is not valid UTF-8
 * (RFC 3629's table: no overlong form, no surrogate, nothing past U+10FFFF). */
static int utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    int need;
    unsigned char low = 0x80, high = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) low = 0xA0;  /* overlong below U+0800 */
        if (c == 0xED) high = 0x9F; /* U+D800..DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) low = 0x90;  /* overlong below U+10000 */
        if (c == 0xF4) high = 0x8F; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (end - p <= need) return 0;
    if (p[1] < low || p[1] > high) return 0;
    for (int i = 2; i <= need; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return need + 1;
}

/* Whether none of the eight bytes of x is '"', '\\', a control character or non-ASCII: the
 * classic tests for a zero byte and a byte below n, exact as a whole-word yes/no (a borrow
 * starts only at a byte that matches). */
static int plain_word(uint64_t x) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t quote = x ^ (ones * '"'), backslash = x ^ (ones * '\\');
    uint64_t found = ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) |
                     ((x - ones * 0x20) & ~x) | x;
    return (found & highs) == 0;
}

/* The first byte at or after p that is '"', '\\', a control character or non-ASCII, 16 bytes a
 * step (SSE2, every x86-64 has it; elsewhere p itself: plain_word's 8 follow either way). A
 * signed compare below 0x20 takes the control characters and every byte from 0x80 at once. */
static const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i found = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                  _mm_cmpeq_epi8(v, backslash)),
                                     _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(found);
        if (mask != 0) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#else
    (void)end;
#endif
    return p;
}

/* The string whose opening quote is at s->p: leaves s->p after its closing quote and returns
 * SCAN_OK, with *escaped set when it holds an escape; or another code. */
static int scan_string(scanner_t *s, int *escaped) {
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    for (;;) {
        p = plain_run(p, end);
        while (end - p >= 8) {
            uint64_t word;
            memcpy(&word, p, 8);
            if (!plain_word(word)) break;
            p += 8;
        }
        if (p >= end) return SCAN_NOT_JSON;
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            return SCAN_OK;
        }
        if (c < 0x20) return SCAN_NOT_JSON;
        if (c < 0x80 && c != '\\') {
            p++;
            continue;
        }
        if (c >= 0x80) {
            int length = utf8_length(p, end);
            if (length == 0) return SCAN_NOT_JSON;
            p += length;
            continue;
        }
        *escaped = 1; /* a backslash */
        if (end - p < 2) return SCAN_NOT_JSON;
        c = p[1];
        if (strchr("\"\\/bfnrt", c) != NULL && c != '\0') {
            p += 2;
            continue;
        }
        if (c != 'u' || end - p < 6) return SCAN_NOT_JSON;
        long unit = hex4(p + 2);
        if (unit < 0) return SCAN_NOT_JSON;
        p += 6;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return SCAN_LONE_SURROGATE;
        if (unit >= 0xD800 && unit <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return SCAN_LONE_SURROGATE;
            long low = hex4(p + 2);
            if (low < 0) return SCAN_NOT_JSON;
            if (low < 0xDC00 || low > 0xDFFF) return SCAN_LONE_SURROGATE;
            p += 6;
        }
    }
}

/* Reads a validated string's contents (the bytes between its quotes) as the UTF-8 bytes it
 * decodes to, one at a time: what two spellings of one key have in common. */
typedef struct {
    const unsigned char *p, *end;
    unsigned char pending[4];
    int have, next;
} decoder_t;

static void decoder_init(decoder_t *d, const unsigned char *start, uint32_t length) {
    d->p = start;
    d->end = start + length;
    d->have = d->next = 0;
}

static void put_utf8(decoder_t *d, long code) {
    d->next = 0;
    if (code < 0x80) {
        d->pending[0] = (unsigned char)code;
        d->have = 1;
    } else if (code < 0x800) {
        d->pending[0] = (unsigned char)(0xC0 | (code >> 6));
        d->pending[1] = (unsigned char)(0x80 | (code & 0x3F));
        d->have = 2;
    } else if (code < 0x10000) {
        d->pending[0] = (unsigned char)(0xE0 | (code >> 12));
        d->pending[1] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
        d->pending[2] = (unsigned char)(0x80 | (code & 0x3F));
        d->have = 3;
    } else {
        d->pending[0] = (unsigned char)(0xF0 | (code >> 18));
        d->pending[1] = (unsigned char)(0x80 | ((code >> 12) & 0x3F));
        d->pending[2] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
        d->pending[3] = (unsigned char)(0x80 | (code & 0x3F));
        d->have = 4;
    }
}

/* The next decoded byte, or -1 at the end. The string was validated by scan_string. */
static int decoder_next(decoder_t *d) {
    if (d->next < d->have) return d->pending[d->next++];
    if (d->p >= d->end) return -1;
    unsigned char c = *d->p;
    if (c != '\\') {
        d->p++;
        return c;
    }
    unsigned char kind = d->p[1];
    d->p += 2;
    long code;
    switch (kind) {
    case 'b': code = '\b'; break;
    case 'f': code = '\f'; break;
    case 'n': code = '\n'; break;
    case 'r': code = '\r'; break;
    case 't': code = '\t'; break;
    case 'u':
        code = hex4(d->p);
        d->p += 4;
        if (code >= 0xD800 && code <= 0xDBFF) { /* a pair: scan_string saw the low half */
            code = 0x10000 + ((code - 0xD800) << 10) + (hex4(d->p + 2) - 0xDC00);
            d->p += 6;
        }
        break;
    default: code = kind; /* '"', '\\', '/' */
    }
    put_utf8(d, code);
    return d->pending[d->next++];
}

static uint32_t key_hash(const unsigned char *start, uint32_t length, int escaped) {
    uint32_t hash = 2166136261u; /* FNV-1a over the decoded bytes */
    if (!escaped) {
        for (uint32_t i = 0; i < length; i++) hash = (hash ^ start[i]) * 16777619u;
        return hash;
    }
    decoder_t d;
    decoder_init(&d, start, length);
    for (int c; (c = decoder_next(&d)) >= 0;) hash = (hash ^ (uint32_t)c) * 16777619u;
    return hash;
}

static int same_key(const unsigned char *a, uint32_t a_length, const unsigned char *b,
                    uint32_t b_length) {
    decoder_t x, y;
    decoder_init(&x, a, a_length);
    decoder_init(&y, b, b_length);
    for (;;) {
        int c = decoder_next(&x);
        if (c != decoder_next(&y)) return 0;
        if (c < 0) return 1;
    }
}

/* Sets may_fetch when the string's contents decode to one of FETCH_NAMES. A name has no
 * character to escape, so only a string of at most six bytes per character can spell one. */
static void screen_fetch(scanner_t *s, const unsigned char *start, uint32_t length, int escaped) {
    if (s->may_fetch || length > 6 * FETCH_LONGEST) return;
    unsigned char text[FETCH_LONGEST + 1];
    uint32_t n = 0;
    if (!escaped) {
        /* most strings are no name's length: a bit per length a name has (6, 7, 8, 9, 14) */
        if (length > FETCH_LONGEST || !((FETCH_LENGTHS >> length) & 1)) return;
        memcpy(text, start, length);
        n = length;
    } else {
        decoder_t d;
        decoder_init(&d, start, length);
        for (int c; (c = decoder_next(&d)) >= 0;) {
            if (n == FETCH_LONGEST) return; /* longer than every name */
            text[n++] = (unsigned char)c;
        }
    }
    for (size_t i = 0; i < FETCH_COUNT; i++)
        if (strlen(FETCH_NAMES[i]) == n && memcmp(FETCH_NAMES[i], text, n) == 0) s->may_fetch = 1;
}

static int is_one_of(const unsigned char *start, uint32_t length, const char *const *names,
                     size_t count) {
    for (size_t i = 0; i < count; i++)
        if (strlen(names[i]) == length && memcmp(names[i], start, length) == 0) return (int)i;
    return -1;
}

/* A key just read (unescaped or not): at the top level, whether it opens a content member
 * (compared as written: a key spelled with an escape is no content key here, so its value is
 * parsed and judged whole); inside one, a key with an escape, a fetch name or `type` is
 * judged (the last, by its value). */
static void screen_key(scanner_t *s, int level, const unsigned char *start, uint32_t length,
                       int escaped) {
    if (level == 0) {
        s->member = escaped ? -1 : is_one_of(start, length, JSON_SCAN_CONTENT_KEYS,
                                             JSON_SCAN_CONTENT_COUNT);
        return;
    }
    if (s->member < 0) return;
    if (escaped || is_one_of(start, length, FETCH_NAMES, FETCH_COUNT) >= 0) s->plain = 0;
    s->type_value = length == 4 && memcmp(start, "type", 4) == 0;
}

/* A number inside content: plain when every parser reads it as the same double. */
static int plain_number(const unsigned char *start, const unsigned char *end) {
    if (end - start > PLAIN_NUMBER_CHARS) return 0;
    for (const unsigned char *p = start; p < end; p++)
        if (*p == 'e' || *p == 'E') return 0;
    return 1;
}

/* A key just scanned (contents at start, length bytes) into the table of the object open at
 * level (0-based): SCAN_OK, or SCAN_KEY_TWICE / SCAN_TOO_MANY_KEYS. */
static int remember_key(scanner_t *s, int level, uint32_t serial, uint32_t *keys,
                        const unsigned char *start, uint32_t length, int escaped) {
    if (++*keys > MAX_KEYS) return SCAN_TOO_MANY_KEYS;
    slot_t *table = tables[level];
    uint32_t hash = key_hash(start, length, escaped);
    for (uint32_t i = hash & (TABLE_SLOTS - 1);; i = (i + 1) & (TABLE_SLOTS - 1)) {
        slot_t *slot = &table[i];
        if (slot->serial != serial) { /* empty for this object: the key is new */
            slot->serial = serial;
            slot->hash = hash;
            slot->start = (uint32_t)(start - s->body);
            slot->length = length;
            return SCAN_OK;
        }
        if (slot->hash == hash && same_key(s->body + slot->start, slot->length, start, length))
            return SCAN_KEY_TWICE;
    }
}

static int scan_number(scanner_t *s) {
    const unsigned char *p = s->p, *end = s->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return SCAN_NOT_JSON;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return SCAN_NOT_JSON;
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return SCAN_NOT_JSON;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return SCAN_NOT_JSON;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return SCAN_OK;
}

static int scan_literal(scanner_t *s, const char *word) {
    size_t length = strlen(word);
    if ((size_t)(s->end - s->p) < length || memcmp(s->p, word, length) != 0) return SCAN_NOT_JSON;
    s->p += length;
    return SCAN_OK;
}

static uint32_t take_serial(void) {
    if (next_serial == UINT32_MAX) { /* after 4 billion objects: every slot's serial is stale */
        memset(tables, 0, sizeof tables);
        next_serial = 1;
    }
    return next_serial++;
}

/* The whole text: an explicit stack of the open containers (no recursion), states as labels. */
static int scan_text(scanner_t *s, int max_depth, long max_values) {
    int is_object[MAX_LEVELS];
    uint32_t serial[MAX_LEVELS], keys[MAX_LEVELS];
    int depth = 0, code, escaped, judging;
    long counted = 0;
    const unsigned char *start;
    uint32_t length;

    s->p = skip_space(s->p, s->end);
    if (s->p >= s->end || *s->p != '{') return SCAN_NOT_JSON;

value: /* s->p at a value's first byte, or past the end */
    if (s->p >= s->end) return SCAN_NOT_JSON;
    if (depth == 1 && s->member >= 0) { /* a content member's value begins */
        if (s->span_count == JSON_SCAN_CONTENT_COUNT) return SCAN_NOT_JSON; /* never: keys once */
        s->spans[s->span_count].key = s->member;
        s->spans[s->span_count].start = (uint32_t)(s->p - s->body);
    }
    judging = s->type_value;
    s->type_value = 0;
    if (judging && *s->p != '"') s->plain = 0; /* a `type` that is not a plain name */
    switch (*s->p) {
    case '{':
    case '[':
        if (depth == max_depth) return SCAN_TOO_DEEP;
        if (++counted > max_values) return SCAN_TOO_MANY;
        is_object[depth] = *s->p == '{';
        serial[depth] = is_object[depth] ? take_serial() : 0;
        keys[depth] = 0;
        depth++;
        s->p = skip_space(s->p + 1, s->end);
        if (s->p < s->end && *s->p == (is_object[depth - 1] ? '}' : ']')) {
            s->p++;
            depth--;
            goto after;
        }
        if (is_object[depth - 1]) goto key;
        goto value;
    case '"':
        start = s->p + 1;
        if ((code = scan_string(s, &escaped)) != SCAN_OK) return code;
        length = (uint32_t)(s->p - 1 - start);
        screen_fetch(s, start, length, escaped);
        if (judging && (escaped || is_one_of(start, length, JSON_SCAN_PLAIN_TYPES,
                                             JSON_SCAN_PLAIN_COUNT) < 0))
            s->plain = 0;
        goto after;
    case 't': code = scan_literal(s, "true"); break;
    case 'f': code = scan_literal(s, "false"); break;
    case 'n': code = scan_literal(s, "null"); break;
    default:
        start = s->p;
        code = scan_number(s);
        if (code == SCAN_OK && s->member >= 0 && !plain_number(start, s->p)) s->plain = 0;
    }
    if (code != SCAN_OK) return code;
    goto after;

key: /* s->p at an object member's first byte, or past the end */
    if (s->p >= s->end || *s->p != '"') return SCAN_NOT_JSON;
    start = s->p + 1;
    if ((code = scan_string(s, &escaped)) != SCAN_OK) return code;
    length = (uint32_t)(s->p - 1 - start);
    screen_fetch(s, start, length, escaped);
    screen_key(s, depth - 1, start, length, escaped);
    code = remember_key(s, depth - 1, serial[depth - 1], &keys[depth - 1], start, length, escaped);
    if (code != SCAN_OK) return code;
    s->p = skip_space(s->p, s->end);
    if (s->p >= s->end || *s->p != ':') return SCAN_NOT_JSON;
    if (++counted > max_values) return SCAN_TOO_MANY;
    s->p = skip_space(s->p + 1, s->end);
    goto value;

after: /* a value just ended */
    if (depth == 1 && s->member >= 0) { /* a content member's value ends */
        s->spans[s->span_count++].end = (uint32_t)(s->p - s->body);
        s->member = -1;
    }
    s->p = skip_space(s->p, s->end);
    if (depth == 0) return s->p == s->end ? SCAN_OK : SCAN_NOT_JSON;
    if (s->p >= s->end) return SCAN_NOT_JSON;
    if (*s->p == ',') {
        if (++counted > max_values) return SCAN_TOO_MANY;
        s->p = skip_space(s->p + 1, s->end);
        if (is_object[depth - 1]) goto key;
        goto value;
    }
    if (*s->p != (is_object[depth - 1] ? '}' : ']')) return SCAN_NOT_JSON;
    s->p++;
    depth--;
    goto after;
}

int json_scan(const unsigned char *body, size_t length, int max_depth, long max_values,
              int *may_fetch, json_span_t *spans, int *span_count) {
    scanner_t s = {body, body, body + length, 0, -1, 1, 0, spans, 0};
    int code = scan_text(&s, max_depth, max_values);
    *may_fetch = s.may_fetch;
    *span_count = s.plain ? s.span_count : -1;
    return code;
}
