/* JSON and text for the `lnk` client (lnk_client.c): a strict reader for the controller's
 * frames, a writer for the client's, and the conversions between bytes, Python's strings and
 * what a person reads. See lnk_client_json.c for why each is as it is. */
#ifndef LNK_CLIENT_JSON_H
#define LNK_CLIENT_JSON_H
#include <stdbool.h>
#include <stddef.h>

#define JSON_MAX_DEPTH 32 /* arrays and objects within each other: a frame is 2-3 deep */

enum json_kind { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_INT, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

/* A parsed value. Strings are WTF-8: UTF-8 that also holds lone surrogates (U+D800-U+DFFF, as
   three bytes), so a string Python would read, including \udcXX for a file name's stray
   bytes, is kept exactly and written back the same. */
struct json_value {
    enum json_kind kind;
    long long integer;        /* JSON_INT */
    char *text;               /* JSON_STRING: WTF-8, NUL-terminated (it may hold NULs too) */
    size_t length;            /* JSON_STRING: its bytes, without the terminator */
    struct json_value *items; /* JSON_ARRAY: the values; JSON_OBJECT: key, value, key, ... */
    size_t count;             /* entries in `items` (twice the members, for an object) */
};

/* A growing byte buffer; every append aborts the program with "lnk: out of memory" on failure
   (the client has nothing to save: it exits). */
struct text {
    char *data;
    size_t length, capacity;
};

void text_bytes(struct text *t, const char *data, size_t length);
void text_str(struct text *t, const char *s);
void text_free(struct text *t);
/* A short printf-formatted piece (at most 127 bytes: numbers and fixed words). */
__attribute__((format(printf, 2, 3))) void text_format(struct text *t, const char *format, ...);

/* Parse `length` bytes as exactly one JSON object (nothing before or after it). 0, or -1 with
   `*why` saying what is wrong (a static string). On success free `out` with json_free. */
int json_parse(const char *data, size_t length, struct json_value *out, const char **why);
void json_free(struct json_value *value);
/* The member `key` (ASCII, no NUL) of an object, or NULL. */
const struct json_value *json_get(const struct json_value *object, const char *key);
/* `value` is the string `s` (ASCII, no NUL). */
bool json_is(const struct json_value *value, const char *s);

/* A JSON string of `length` bytes read as Python reads argv, the environment and file names
   (UTF-8, with each byte that is not part of valid UTF-8 as the lone surrogate U+DC00+byte),
   written as Python's json.dumps writes it: ASCII only, \uXXXX for the rest. */
void json_put_bytes(struct text *t, const char *data, size_t length);
/* The same for a WTF-8 string (a parsed one): written back exactly as it was read. */
void json_put_wtf8(struct text *t, const char *data, size_t length);

/* A WTF-8 string as Python prints it on stderr (errors="backslashreplace"): UTF-8, each lone
   surrogate as the text \udcXX. */
void text_printable(struct text *t, const char *data, size_t length);
/* Bytes (argv, the environment, a file name) as Python prints them once read: each stray byte
   as the text \udcXX. */
void text_printable_bytes(struct text *t, const char *data, size_t length);
/* The file name a WTF-8 string stands for (os.fsencode): U+DC80-U+DCFF back to their bytes.
   NULL (errno EILSEQ) when it holds a NUL or another lone surrogate; else free() it. */
char *wtf8_file_name(const char *data, size_t length);
/* The bytes of the first `chars` code points of a WTF-8 string (Python's s[:chars]). */
size_t wtf8_prefix(const char *data, size_t length, size_t chars);
/* repr(value) as Python writes it, for a message that quotes what the controller sent. */
void text_repr(struct text *t, const struct json_value *value);
#endif
