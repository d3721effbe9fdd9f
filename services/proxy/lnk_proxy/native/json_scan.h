/* json_scan.h: the one pass over a model request's body (json_scan.c says what and why). */
#ifndef LNK_JSON_SCAN_H
#define LNK_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

enum {
    SCAN_OK = 0,
    SCAN_NOT_JSON = 1,       /* not one strict RFC 8259 text, or its top level no object */
    SCAN_KEY_TWICE = 2,      /* an object has a key twice */
    SCAN_TOO_DEEP = 3,       /* nesting past max_depth */
    SCAN_TOO_MANY = 4,       /* more than max_values values and members */
    SCAN_LONE_SURROGATE = 5, /* an escape of half a surrogate pair alone */
    SCAN_TOO_MANY_KEYS = 6,  /* an object with more keys than a table holds: not judged here */
};

#define MAX_LEVELS 64 /* strict_json.MAX_DEPTH: the deepest max_depth a caller may ask */
#define MAX_KEYS 128  /* the most keys of one object the pass judges (TOO_MANY_KEYS past) */

/* hosted_bodies.FETCH_NAMES, in its order (a unit test compares the two lists). */
extern const char *const JSON_SCAN_FETCH_NAMES[];
extern const size_t JSON_SCAN_FETCH_COUNT;

/* hosted_bodies.CONTENT_KEYS and PLAIN_TYPES, in their order (a unit test compares them). */
extern const char *const JSON_SCAN_CONTENT_KEYS[];
extern const size_t JSON_SCAN_CONTENT_COUNT; /* 4: spans[] holds this many */
extern const char *const JSON_SCAN_PLAIN_TYPES[];
extern const size_t JSON_SCAN_PLAIN_COUNT;

/* Where a top-level content member's value lies: body[start..end), key an index into
 * JSON_SCAN_CONTENT_KEYS. */
typedef struct {
    int key;
    uint32_t start, end;
} json_span_t;

/* The pass over body[0..length) (length < 4 GiB, 1 <= max_depth <= MAX_LEVELS): a SCAN_ code;
 * *may_fetch set to 1 when a string decodes to one of the fetch names (else left 0);
 * *span_count the content members' spans written to spans[] (at most
 * JSON_SCAN_CONTENT_COUNT), or -1 when one of them holds something judged (json_scan.c says
 * what). Both mean something only with SCAN_OK. Not reentrant: its key tables are static (the
 * module calls it with the GIL held). */
int json_scan(const unsigned char *body, size_t length, int max_depth, long max_values,
              int *may_fetch, json_span_t *spans, int *span_count);

#endif
