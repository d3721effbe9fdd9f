/* The `lnk` client's units (lnk_client.c and its lnk_client_*.c): what they share. */
#ifndef LNK_CLIENT_H
#define LNK_CLIENT_H
#include <stdbool.h>
#include <stddef.h>

#include "lnk_launch_protocol.h" /* written from lnk_shared.launch_protocol */

/* lnk_shared.frames' bounds, for the launch socket's frames and the bridges' alike */
#define MAX_FRAME LNK_MAX_FRAME /* a launch request or reply is a few KiB; more is an attack */
#define MAX_FDS LNK_MAX_FDS     /* stdio, a spec file and the granted folders: far below this */
#define HEADER_BYTES LNK_HEADER_BYTES /* a frame's length, big-endian, before its JSON */
/* lnk_shared.errors' exit codes. This client's own path is only `lnk sandbox run`, which exits
   with the program's status: its own failures are a run's (errors.EXIT_RUN_*, as env, timeout
   and docker run), never 1-3, which a program uses for its own. */
#define EXIT_ERROR 1         /* errors.EXIT_ERROR: a command that runs no program */
#define EXIT_USAGE 2         /* errors.EXIT_USAGE: words lnk does not take */
#define EXIT_RUN_ERROR 125   /* errors.EXIT_RUN_ERROR: LnkError, StateError, SpecError */
#define EXIT_RUN_REFUSED 126 /* errors.EXIT_RUN_REFUSED: RefusedError, NotConfirmedError */

/* --- text (lnk_client_text.c) ------------------------------------------------------------ */

/* A growing byte buffer, always NUL-terminated too; an append that cannot get memory ends the
   client with "lnk: out of memory" (there is nothing to save: it exits). */
struct text {
    char *data;
    size_t length, capacity;
};

__attribute__((noreturn)) void out_of_memory(void);
void text_bytes(struct text *t, const char *data, size_t length);
void text_str(struct text *t, const char *s);
void text_free(struct text *t);
/* A short printf-formatted piece (at most 127 bytes: numbers, strerror and fixed words). */
__attribute__((format(printf, 2, 3))) void text_format(struct text *t, const char *format, ...);

/* Strict UTF-8: no overlong form, no surrogate, nothing past U+10FFFF. */
bool utf8_valid(const char *data, size_t length);
bool is_surrogate(long code);
/* `code` as WTF-8 into `out` (room for 4 bytes); the bytes written. */
size_t put_code_point(char *out, long code);
/* The next code point of `data` at `*at`, read as WTF-8 (`wtf8`) or as bytes decoded with
   surrogateescape; `*at` always advances. A byte that starts nothing valid is U+DC00+byte
   either way (for WTF-8 this never happens with a string json_parse made). */
long next_char(const char *data, size_t length, size_t *at, bool wtf8);

/* A WTF-8 string as Python prints it on stderr (errors="backslashreplace"): UTF-8, each lone
   surrogate as the text \udcXX. */
void text_printable(struct text *t, const char *data, size_t length);
/* Bytes (argv, the environment, a file name) as Python prints them once read: each stray byte
   as the text \udcXX. */
void text_printable_bytes(struct text *t, const char *data, size_t length);
/* repr(s) as Python writes it, for a WTF-8 string. */
void text_repr_string(struct text *t, const char *data, size_t length);
/* The file name a WTF-8 string stands for (os.fsencode): U+DC80-U+DCFF back to their bytes.
   NULL (errno EILSEQ) when it holds a NUL or another lone surrogate; else free() it. */
char *wtf8_file_name(const char *data, size_t length);
/* The bytes of the first `chars` code points of a WTF-8 string (Python's s[:chars]). */
size_t wtf8_prefix(const char *data, size_t length, size_t chars);

/* A message: "lnk: " to start, then message_exit prints it and a newline on stderr and exits
   with `code`; fail does both for a fixed text. */
void write_all(int fd, const char *data, size_t length);
struct text message_start(void);
__attribute__((noreturn)) void message_exit(struct text *m, int code);
__attribute__((noreturn)) void fail(int code, const char *what);

/* --- JSON (lnk_client_json.c) ------------------------------------------------------------ */

#define JSON_MAX_DEPTH 32 /* arrays and objects within each other: a frame is 2-3 deep */
/* An event or a bridge's answer holds what an agent stored: Python's json nests as deep as its
   recursion limit (1000) lets it, and this parser as deep, on a stack far larger. */
#define JSON_VALUE_MAX_DEPTH 1000

enum json_kind {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_INT,
    JSON_NUMBER, /* json_parse_value only: any number (NaN, Infinity too), `text` as written */
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
};

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

/* Parse `length` bytes as exactly one JSON object (nothing before or after it). 0, or -1 with
   `*why` saying what is wrong (a static string). On success free `out` with json_free. */
int json_parse(const char *data, size_t length, struct json_value *out, const char **why);
void json_free(struct json_value *value);
/* Any one JSON value as Python's json.loads reads it (whitespace around it, every number as
   JSON_NUMBER, NaN and Infinity), duplicate keys refused unless JSON_LAST_WINS. */
#define JSON_NUMBERS 1
#define JSON_LAST_WINS 2
int json_parse_value(const char *data, size_t length, struct json_value *out, const char **why,
                     int flags);
/* The member `key` (ASCII, no NUL) of an object, or NULL. */
const struct json_value *json_get(const struct json_value *object, const char *key);
/* `value` is the string `s` (ASCII, no NUL). */
bool json_is(const struct json_value *value, const char *s);
/* A JSON string of `length` bytes read as Python reads argv, the environment and file names
   (UTF-8, each byte that is not part of valid UTF-8 as the lone surrogate U+DC00+byte),
   written as Python's json.dumps writes it: ASCII only, \uXXXX for the rest. */
void json_put_bytes(struct text *t, const char *data, size_t length);
/* The same for a WTF-8 string (a parsed one): written back exactly as it was read. */
void json_put_wtf8(struct text *t, const char *data, size_t length);
/* repr(value) as Python writes it, for a message that quotes what the controller sent. */
void text_repr(struct text *t, const struct json_value *value);

/* --- values as Python writes them (lnk_client_values.c) ---------------------------------- */

/* json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False): 0, or -1 with
   `*why` (a string holding a lone surrogate, an integer past Python's digit limit). */
int json_put_canonical(struct text *t, const struct json_value *v, const char **why);
/* json.dumps(v, indent=2, ensure_ascii=False), members in their order, at `level`. */
int json_put_pretty(struct text *t, const struct json_value *v, int level, const char **why);

/* --- an agent's proof (lnk_client_proof.c) ----------------------------------------------- */

#define PROOF_LIFETIME_S 60 /* proofs.DEFAULT_MAX_LIFETIME_S: valid for a minute */
struct proof_call {
    const char *agent, *audience, *action;
    const char *body;
    size_t body_length;
};
void base64_put(struct text *t, const unsigned char *data, size_t length);
/* The key file's 32-byte seed (its checks: lnk_client_proof.c); -1 with the message in `why`
   ("cannot read the agent's key PATH: ..."). */
int agent_key_read(const char *path, unsigned char seed[32], struct text *why);
/* proofs.signed_bytes */
void proof_signed_bytes(struct text *t, const struct proof_call *call, const unsigned char *nonce,
                        long long created, long long expires);
/* proofs.sign_call's wire object as send_frame writes it, appended to `t`; `fixed_nonce` NULL
   for a random one (16 bytes otherwise: tests). 0, or -1 (no randomness, a bad seed). */
int proof_sign(struct text *t, const struct proof_call *call, const unsigned char *seed,
               long long now, const unsigned char *fixed_nonce);

/* --- `lnk bridge` (lnk_client_bridge.c) -------------------------------------------------- */

/* `lnk bridge ...` in its plain forms: the call, then exit; returns only for another form. */
void bridge_command(int argc, char **argv);
extern const char *const BRIDGE_USAGE; /* the plain forms, one a line */

/* --- the launch dialogue (lnk_client_dialogue.c) ----------------------------------------- */

/* Before anything of the quick path: SIGPIPE ignored (a closed stderr or socket is an error,
   not a death) and Ctrl-C as "lnk: interrupted", as in Python. */
void signals_start(void);
/* SIGINT, SIGTERM, SIGHUP and SIGQUIT held (blocked) from before the request is sent until
   the sandbox has started: then the dialogue forwards them to its program. */
void signals_hold(void);
/* A frame is built in a text that starts with frame_begin's room for its header. */
void frame_begin(struct text *t);
/* Send it with `fds` on its first byte; a lost connection ends the client. */
void frame_send(int sock, struct text *t, const int *fds, size_t count);
/* The controller's answers to the request, to the end: exits with the program's status or the
   Python client's message and code for the answer. */
__attribute__((noreturn)) void dialogue(int sock);
#endif
