/* SHA-256 against FIPS 180-4 examples and HMAC-SHA-256 against the RFC 4231 test cases. */
#include <string.h>

#include "envelope.h"
#include "hmac.h"
#include "test.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void unhex(const char *h, uint8_t *out, size_t *n)
{
    *n = strlen(h) / 2;
    for (size_t i = 0; i < *n; i++) {
        unsigned v;
        CHECK(sscanf(h + 2 * i, "%2x", &v) == 1);
        out[i] = (uint8_t)v;
    }
}

TEST(sha256_known_answers)
{
    uint8_t d[32];
    char h[65];
    cp_sha256("abc", 3, d);
    hex(d, 32, h);
    CHECK_STREQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    cp_sha256("", 0, d);
    hex(d, 32, h);
    CHECK_STREQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 448 bits */
    cp_sha256(m, strlen(m), d);
    hex(d, 32, h);
    CHECK_STREQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static uint8_t million[1000000];
    memset(million, 'a', sizeof million);
    cp_sha256(million, sizeof million, d);
    hex(d, 32, h);
    CHECK_STREQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(hmac_sha256_rfc4231)
{
    static const struct {
        const char *key, *data, *mac;
    } cases[] = {
        /* 1 */ {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
                 "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        /* 2 */
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        /* 3 */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddddddddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        /* 4 */
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcdcdcdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        /* 6: a key longer than the block */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaa", /* 131 bytes */
         "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048"
         "617368204b6579204669727374",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        /* 7: a long key and long data */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaa", /* 131 bytes */
         "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b"
         "2d73697a65206b657920616e642061206c6172676572207468616e20626c6f636b2d73697a652064"
         "6174612e20546865206b6579206e6565647320746f20626520686173686564206265666f72652062"
         "65696e6720757365642062792074686520484d414320616c676f726974686d2e",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t key[256], data[256], mac[32];
        size_t kl, dl;
        char h[65];
        unhex(cases[i].key, key, &kl);
        unhex(cases[i].data, data, &dl);
        cp_hmac_sha256(key, kl, data, dl, mac);
        hex(mac, 32, h);
        if (strcmp(h, cases[i].mac)) fprintf(stderr, "case %zu\n", i);
        CHECK_STREQ(h, cases[i].mac);
    }
    uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    CHECK(cp_ct_equal(a, a, 4));
    CHECK(!cp_ct_equal(a, b, 4));
}

/* A signed envelope still decodes to the same envelope, verifies with its token only, and
 * any changed byte (the tenant's among them) breaks it. */
TEST(envelope_signature)
{
    cp_envelope e = {0};
    e.tenant = (char *)"team-a";
    e.kind = CP_KIND_CPU;
    e.window_start_ns = 1764000000000000000LL;
    e.window_duration_ns = 10000000000LL;
    e.producer_id = (char *)"p1";
    e.sequence = 7;
    uint8_t pprof[4] = {1, 2, 3, 4};
    e.pprof = pprof;
    e.pprof_len = sizeof pprof;
    CHECK(cp_labels_set(&e.labels, "service", "api") == 0);
    cp_buf enc = {0};
    CHECK(cp_envelope_encode(&e, &enc) == 0);
    size_t plain = enc.len;
    CHECK(!cp_envelope_verify(enc.data, enc.len, "team-a-token"));
    CHECK(cp_envelope_sign(&enc, "team-a-token") == 0);
    CHECK_EQ(enc.len, plain + CP_ENVELOPE_AUTH_LEN);
    CHECK(cp_envelope_verify(enc.data, enc.len, "team-a-token"));
    CHECK(!cp_envelope_verify(enc.data, enc.len, "team-b-token"));
    cp_envelope d = {0};
    cp_err err = {0};
    CHECK(cp_envelope_decode(enc.data, enc.len, 1 << 20, &d, &err) == 0);
    CHECK_STREQ(d.tenant, "team-a");
    CHECK_EQ(d.sequence, 7u);
    CHECK_EQ(d.pprof_len, sizeof pprof);
    cp_envelope_close(&d);
    uint8_t *t = memmem(enc.data, plain, "team-a", 6);
    CHECK(t);
    t[5] = 'b'; /* claims tenant team-b */
    CHECK(!cp_envelope_verify(enc.data, enc.len, "team-a-token"));
    CHECK(!cp_envelope_verify(enc.data, enc.len, "team-b-token"));
    cp_buf_close(&enc);
    cp_labels_close(&e.labels);
}

TEST_MAIN(T(sha256_known_answers), T(hmac_sha256_rfc4231), T(envelope_signature))
