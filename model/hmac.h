/* SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), small and dependency-free so that the
 * agent can sign envelopes without loading libcrypto into the programs it profiles. */
#ifndef CP_HMAC_H
#define CP_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define CP_SHA256_LEN 32

/* out = SHA-256(msg). */
void cp_sha256(const void *msg, size_t len, uint8_t out[CP_SHA256_LEN]);

/* out = HMAC-SHA-256(key, msg). */
void cp_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t len,
                    uint8_t out[CP_SHA256_LEN]);

/* 1 if the n bytes at a and b are equal, in time independent of where they differ. */
int cp_ct_equal(const void *a, const void *b, size_t n);

#endif
