/* An agent's proof for a bridge call, in C (lnk_client.h): the wire object of
 * lnk_shared.proofs.sign_call, byte for byte, signed with the agent's Ed25519 key read as
 * lnk_shared.proof_client.load_private_key reads it.
 *
 * Why in C: under a finite [commands] list the box grants its `lnk` but never the Python behind
 * it (box_client.py), so the signing cannot be Python's. Ed25519 and SHA-256 are libsodium's
 * (crypto_sign_detached over the seed's key pair, crypto_hash_sha256), linked statically
 * (lnk_shared/native_build.py LIBRARIES): nothing here is hand-written crypto. The nonce is 16
 * bytes of getrandom(2).
 *
 * The key file: a regular file of the caller's own (its owner is this process's uid), readable
 * by nobody else (no group or other bits), at most KEY_FILE_MAX_BYTES, holding one unencrypted
 * PKCS#8 Ed25519 key in PEM (what the controller writes: agents.py). The same refusals as
 * load_private_key, with the same messages (a test holds them equal); a key in another PEM
 * form Python's loader would take (an explicit public key, RFC 8410's v2) is refused here: the
 * box never writes one.
 *
 * What this does NOT do: keep the key from anyone who can read the file (the wall does), or
 * make the process's memory unreadable (the seed is wiped once used; a core dump or a ptrace by
 * the same uid is the sandbox's own business).
 */
#define _GNU_SOURCE
#include "lnk_client.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* proofs.MAGIC, PROOF_VERSION, NONCE_BYTES */
#define PROOF_MAGIC "lnk-agent-proof\0"
#define PROOF_MAGIC_BYTES 16
#define PROOF_VERSION 1
#define NONCE_BYTES 16
/* An Ed25519 key in PEM is 119 bytes; a few KiB is past any real one and bounds the read. */
#define KEY_FILE_MAX_BYTES 4096
#define SPELLED(x) #x
#define SPELLED_NUMBER(x) SPELLED(x)
#define SEED_BYTES 32
#define PEM_BEGIN "-----BEGIN PRIVATE KEY-----"
#define PEM_END "-----END PRIVATE KEY-----"
/* PKCS#8 v1 of an Ed25519 key (RFC 8410 7): SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 },
   OCTET STRING { OCTET STRING (32 bytes) } }, then the seed. */
static const unsigned char PKCS8_PREFIX[] = {0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06,
                                             0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20};

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void base64_put(struct text *t, const unsigned char *data, size_t length) {
    for (size_t i = 0; i < length; i += 3) {
        unsigned long chunk = (unsigned long)data[i] << 16;
        if (i + 1 < length)
            chunk |= (unsigned long)data[i + 1] << 8;
        if (i + 2 < length)
            chunk |= data[i + 2];
        char out[4] = {B64[(chunk >> 18) & 63], B64[(chunk >> 12) & 63],
                       i + 1 < length ? B64[(chunk >> 6) & 63] : '=',
                       i + 2 < length ? B64[chunk & 63] : '='};
        text_bytes(t, out, 4);
    }
}

/* Strict base64 of the PEM's body (line breaks between groups allowed); the bytes, or -1. */
static long base64_read(const char *data, size_t length, unsigned char *out, size_t room) {
    size_t n = 0, pad = 0;
    unsigned long chunk = 0;
    int have = 0;
    for (size_t i = 0; i < length; i++) {
        char c = data[i];
        if (c == '\n' || (c == '\r' && i + 1 < length && data[i + 1] == '\n'))
            continue;
        const char *at = c != '\0' ? strchr(B64, c) : NULL;
        if (c == '=' && have >= 2) {
            pad++;
            chunk <<= 6;
        } else if (at == NULL || pad > 0) {
            return -1;
        } else {
            chunk = chunk << 6 | (unsigned long)(at - B64);
        }
        if (++have == 4) {
            unsigned char bytes[3] = {(unsigned char)(chunk >> 16), (unsigned char)(chunk >> 8),
                                      (unsigned char)chunk};
            if (n + 3 - pad > room)
                return -1;
            memcpy(out + n, bytes, 3 - pad);
            n += 3 - pad;
            have = 0;
            chunk = 0;
        }
    }
    return have == 0 ? (long)n : -1;
}

/* The 32-byte seed of a PKCS#8 PEM, or a static reason. */
static const char *pem_seed(const char *pem, size_t length, unsigned char seed[SEED_BYTES]) {
    if (memmem(pem, length, "ENCRYPTED", 9) != NULL)
        return "it is encrypted (an agent's key has no password)";
    size_t begin = sizeof PEM_BEGIN - 1, end = sizeof PEM_END - 1;
    if (length < begin + 1 || memcmp(pem, PEM_BEGIN, begin) != 0 || pem[begin] != '\n')
        return "it is not a PEM private key (no \"" PEM_BEGIN "\" line first)";
    const char *body = pem + begin + 1;
    const char *tail = memmem(body, length - begin - 1, PEM_END, end);
    if (tail == NULL)
        return "it is not a PEM private key (no \"" PEM_END "\" line)";
    size_t rest = length - (size_t)(tail - pem) - end;
    if (!(rest == 0 || (rest == 1 && tail[end] == '\n')))
        return "it has more after its \"" PEM_END "\" line";
    unsigned char der[64];
    long n = base64_read(body, (size_t)(tail - body), der, sizeof der);
    bool ok = n == (long)(sizeof PKCS8_PREFIX + SEED_BYTES) &&
              memcmp(der, PKCS8_PREFIX, sizeof PKCS8_PREFIX) == 0;
    if (ok)
        memcpy(seed, der + sizeof PKCS8_PREFIX, SEED_BYTES);
    sodium_memzero(der, sizeof der);
    return ok ? NULL : "it is not an unencrypted PKCS#8 Ed25519 private key";
}

/* `path` as Python's str(Path(path)) would show it in a message. */
static void key_message_start(struct text *m, const char *path) {
    text_str(m, "cannot read the agent's key ");
    text_printable_bytes(m, path, strlen(path));
    text_str(m, ": ");
}

int agent_key_read(const char *path, unsigned char seed[SEED_BYTES], struct text *why) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); /* a FIFO cannot hang */
    if (fd < 0) {
        int err = errno;
        key_message_start(why, path);
        text_format(why, "[Errno %d] %s: ", err, strerror(err));
        text_repr_string(why, path, strlen(path)); /* Python's OSError shows the name's repr */
        return -1;
    }
    struct stat info;
    char pem[KEY_FILE_MAX_BYTES + 1];
    ssize_t got = -1;
    const char *problem = NULL;
    if (fstat(fd, &info) != 0)
        problem = "it cannot be examined (fstat failed)";
    else if (!S_ISREG(info.st_mode))
        problem = "it is not a regular file";
    else if (info.st_uid != geteuid()) {
        key_message_start(why, path);
        text_format(why, "it is owned by uid %u, not by you (uid %u)", (unsigned)info.st_uid,
                    (unsigned)geteuid());
        close(fd);
        return -1;
    } else if ((info.st_mode & 077) != 0) {
        key_message_start(why, path);
        text_format(why, "its mode %04o lets others read it (an agent's key is 0400 or 0600)",
                    (unsigned)(info.st_mode & 07777));
        close(fd);
        return -1;
    } else {
        size_t have = 0;
        for (;;) { /* a regular file: short reads only at its end */
            got = read(fd, pem + have, sizeof pem - have);
            if (got <= 0)
                break;
            have += (size_t)got;
            if (have == sizeof pem)
                break;
        }
        if (got < 0)
            problem = "it cannot be read";
        else if (have > KEY_FILE_MAX_BYTES)
            problem = "it is larger than " SPELLED_NUMBER(KEY_FILE_MAX_BYTES) " bytes: not an "
                      "agent's key";
        else
            problem = pem_seed(pem, have, seed);
        sodium_memzero(pem, sizeof pem);
    }
    close(fd);
    if (problem == NULL)
        return 0;
    key_message_start(why, path);
    text_str(why, problem);
    return -1;
}

static void put_length(struct text *t, size_t length) {
    unsigned char be[4] = {(unsigned char)(length >> 24), (unsigned char)(length >> 16),
                           (unsigned char)(length >> 8), (unsigned char)length};
    text_bytes(t, (const char *)be, 4);
}

static void put_field(struct text *t, const void *data, size_t length) {
    put_length(t, length);
    text_bytes(t, data, length);
}

static void put_time(struct text *t, long long value) {
    unsigned char be[8];
    for (int i = 0; i < 8; i++)
        be[i] = (unsigned char)((unsigned long long)value >> (56 - 8 * i));
    put_field(t, be, 8);
}

void proof_signed_bytes(struct text *t, const struct proof_call *call, const unsigned char *nonce,
                        long long created, long long expires) {
    unsigned char digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(digest, (const unsigned char *)call->body, call->body_length);
    text_bytes(t, PROOF_MAGIC, PROOF_MAGIC_BYTES);
    put_length(t, PROOF_VERSION);
    put_field(t, call->agent, strlen(call->agent));
    put_field(t, call->audience, strlen(call->audience));
    put_field(t, call->action, strlen(call->action));
    put_field(t, digest, sizeof digest);
    put_time(t, created);
    put_time(t, expires);
    put_field(t, nonce, NONCE_BYTES);
}

int proof_sign(struct text *t, const struct proof_call *call, const unsigned char *seed,
               long long now, const unsigned char *fixed_nonce) {
    if (sodium_init() < 0)
        return -1;
    unsigned char nonce[NONCE_BYTES];
    if (fixed_nonce != NULL)
        memcpy(nonce, fixed_nonce, NONCE_BYTES);
    else if (getrandom(nonce, NONCE_BYTES, 0) != NONCE_BYTES)
        return -1;
    long long created = now, expires = now + PROOF_LIFETIME_S;
    struct text message = {0};
    proof_signed_bytes(&message, call, nonce, created, expires);
    unsigned char public_key[crypto_sign_PUBLICKEYBYTES], secret[crypto_sign_SECRETKEYBYTES];
    unsigned char signature[crypto_sign_BYTES];
    int failed = crypto_sign_seed_keypair(public_key, secret, seed) != 0 ||
                 crypto_sign_detached(signature, NULL, (const unsigned char *)message.data,
                                      message.length, secret) != 0;
    sodium_memzero(secret, sizeof secret);
    text_free(&message);
    if (failed)
        return -1;
    /* send_frame's json.dumps(separators=(",", ":")): ASCII, in sign_call's key order */
    text_str(t, "{\"v\":1,\"agent\":");
    json_put_bytes(t, call->agent, strlen(call->agent));
    text_str(t, ",\"audience\":");
    json_put_bytes(t, call->audience, strlen(call->audience));
    text_str(t, ",\"action\":");
    json_put_bytes(t, call->action, strlen(call->action));
    text_format(t, ",\"created\":%lld,\"expires\":%lld,\"nonce\":\"", created, expires);
    base64_put(t, nonce, NONCE_BYTES);
    text_str(t, "\",\"body\":\"");
    base64_put(t, (const unsigned char *)call->body, call->body_length);
    text_str(t, "\",\"signature\":\"");
    base64_put(t, signature, sizeof signature);
    text_str(t, "\"}");
    return 0;
}
