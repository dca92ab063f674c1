/* A reader of LevelDB's write-ahead logs (NNNNNN.log), run before the store opens its
 * database: LevelDB names neither the file nor the place of a damaged record, and drops an
 * unfinished record at the end of a log without a word. This check does both. The log
 * format is LevelDB's doc/log_format.md: 32 KiB blocks of records, each a 7-byte header
 * (masked crc32c of type and payload, le16 length, type) and its payload. */
#include "store_int.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WAL_BLOCK WAL_BLOCK_BYTES
#define WAL_HEADER 7

enum { REC_ZERO = 0, REC_FULL = 1, REC_FIRST = 2, REC_MIDDLE = 3, REC_LAST = 4 };

/* ---------------------------------------------------------------------------------
 * crc32c (Castagnoli), as LevelDB computes and masks it
 * --------------------------------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_init(void)
{
    if (crc_table[1]) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t crc_unmask(uint32_t m)
{
    uint32_t rot = m - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

/* A record header: masked crc32c (le32), payload length (le16), type. */
typedef struct wal_hdr {
    uint32_t crc;
    size_t n;
    uint8_t type;
} wal_hdr;

static wal_hdr hdr_read(const uint8_t *h)
{
    wal_hdr r = {(uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24,
                 (size_t)h[4] | (size_t)h[5] << 8, h[6]};
    return r;
}

/* Zeroed header: preallocated space, which LevelDB's reader skips. */
static int hdr_is_padding(const wal_hdr *r)
{
    return r->type == REC_ZERO && r->n == 0 && r->crc == 0;
}

/* ---------------------------------------------------------------------------------
 * One log
 * --------------------------------------------------------------------------------- */

/* Walks the records of one log held in buf. Fills r: complete writes, and the first
 * damaged record (corrupt, bad_at, what) or an unfinished record at the end (tail). */
static void scan_log(const uint8_t *buf, size_t len, cp_wal_report *r)
{
    size_t pos = 0, rec_start = 0;
    int in_record = 0;
    while (pos < len) {
        size_t left_in_block = WAL_BLOCK - pos % WAL_BLOCK;
        if (left_in_block < WAL_HEADER) {
            pos += left_in_block; /* trailer: zero padding */
            continue;
        }
        if (len - pos < WAL_HEADER) {
            r->tail = len - (in_record ? rec_start : pos);
            return;
        }
        const uint8_t *h = buf + pos;
        wal_hdr hd = hdr_read(h);
        uint32_t crc = hd.crc;
        size_t n = hd.n;
        uint8_t type = hd.type;
        if (hdr_is_padding(&hd)) { /* preallocated space (mmap writers): LevelDB skips it */
            pos += WAL_HEADER;
            continue;
        }
        if (WAL_HEADER + n > left_in_block) {
            if (pos + WAL_HEADER + n > len && len - pos <= left_in_block) {
                /* the file ends inside this fragment: an unfinished write */
                r->tail = len - (in_record ? rec_start : pos);
                return;
            }
            r->corrupt = 1;
            r->bad_at = pos;
            snprintf(r->what, sizeof r->what, "bad record length");
            return;
        }
        if (pos + WAL_HEADER + n > len) {
            r->tail = len - (in_record ? rec_start : pos);
            return;
        }
        if (crc32c(0, h + 6, 1 + n) != crc_unmask(crc)) {
            r->corrupt = 1;
            r->bad_at = pos;
            snprintf(r->what, sizeof r->what, "checksum mismatch");
            return;
        }
        int ok = 1;
        switch (type) {
        case REC_FULL:
            ok = !in_record;
            r->records++;
            break;
        case REC_FIRST:
            ok = !in_record;
            in_record = 1;
            rec_start = pos;
            break;
        case REC_MIDDLE:
            ok = in_record;
            break;
        case REC_LAST:
            ok = in_record;
            in_record = 0;
            r->records++;
            break;
        default:
            ok = 0;
        }
        if (!ok) {
            r->corrupt = 1;
            r->bad_at = pos;
            snprintf(r->what, sizeof r->what, "record of type %u out of sequence", type);
            return;
        }
        pos += WAL_HEADER + n;
    }
    if (in_record) r->tail = len - rec_start;
}

static int is_log_name(const char *n)
{
    size_t l = strlen(n);
    if (l < 5 || strcmp(n + l - 4, ".log")) return 0;
    for (size_t i = 0; i + 4 < l; i++)
        if (n[i] < '0' || n[i] > '9') return 0;
    return 1;
}

int cp_wal_scan(const char *dir, cp_wal_report *out, uint32_t max, uint32_t *n, cp_err *err)
{
    crc_init();
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return cp_err_set(err, CP_EIO, "store %s: cannot list the directory: %s", dir,
                          strerror(errno));
    }
    struct dirent *de;
    int rc = 0;
    char path[4352];
    cp_buf b = {0};
    while (!rc && (de = readdir(d)) && *n < max) {
        if (!is_log_name(de->d_name) || strlen(de->d_name) >= sizeof out->file) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        b.len = 0;
        if (cp_read_file(path, &b, NULL)) {
            rc = cp_err_set(err, CP_EIO, "store %s: cannot read %s: %s", dir, de->d_name,
                            strerror(errno));
            break;
        }
        cp_wal_report *r = &out[(*n)++];
        memset(r, 0, sizeof *r);
        memcpy(r->file, de->d_name, strlen(de->d_name) + 1); /* length checked above */
        r->size = b.len;
        scan_log(b.data, b.len, r);
    }
    closedir(d);
    cp_buf_close(&b);
    return rc;
}

int cp_wal_check(const char *dir, cp_err *err)
{
    cp_wal_report r[16];
    uint32_t n = 0;
    int rc = cp_wal_scan(dir, r, 16, &n, err);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++) {
        if (r[i].corrupt)
            return cp_err_set(err, CP_ESTORE,
                              "store %s: corrupted write-ahead log %s: %s at byte %llu "
                              "(%llu bytes from there); run `contprofd --repair --data %s`",
                              dir, r[i].file, r[i].what, (unsigned long long)r[i].bad_at,
                              (unsigned long long)(r[i].size - r[i].bad_at), dir);
        if (r[i].tail)
            cp_log_warn("store %s: write-ahead log %s ends inside a write: its last %llu bytes "
                        "(an unfinished write: a crash or a full disk during it, or a truncated "
                        "file) are dropped; %llu complete writes are kept",
                        dir, r[i].file, (unsigned long long)r[i].tail,
                        (unsigned long long)r[i].records);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Salvage: a copy of a log without its damaged writes
 * --------------------------------------------------------------------------------- */

/* Appends one logical record to out as LevelDB's log writer does (fragments in blocks). */
static int emit_record(cp_buf *out, const uint8_t *p, size_t n)
{
    int begin = 1;
    do {
        size_t off = out->len % WAL_BLOCK;
        if (WAL_BLOCK - off < WAL_HEADER) {
            static const uint8_t zero[WAL_HEADER];
            if (cp_buf_append(out, zero, WAL_BLOCK - off)) return CP_ENOMEM;
            off = 0;
        }
        size_t avail = WAL_BLOCK - off - WAL_HEADER, frag = n < avail ? n : avail;
        int end = frag == n;
        uint8_t type = begin && end ? REC_FULL : begin ? REC_FIRST : end ? REC_LAST : REC_MIDDLE;
        uint8_t h[WAL_HEADER];
        h[6] = type;
        uint32_t crc = crc32c(crc32c(0, &type, 1), p, frag); /* over type and payload */
        uint32_t m = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
        h[0] = (uint8_t)m, h[1] = (uint8_t)(m >> 8), h[2] = (uint8_t)(m >> 16),
        h[3] = (uint8_t)(m >> 24);
        h[4] = (uint8_t)frag, h[5] = (uint8_t)(frag >> 8);
        if (cp_buf_append(out, h, WAL_HEADER) || cp_buf_append(out, p, frag)) return CP_ENOMEM;
        p += frag;
        n -= frag;
        begin = 0;
    } while (n > 0);
    return 0;
}

/* Copies the intact writes of buf into out. A damaged fragment loses the rest of its block
 * (its length cannot be trusted), as LevelDB's reader does, and the write it belonged to is
 * dropped whole; so is an unfinished write at the end. */
static int salvage(const uint8_t *buf, size_t len, cp_buf *out, cp_wal_salvage_stats *st)
{
    cp_buf rec = {0};
    int in_rec = 0, rc = 0;
    size_t pos = 0, rec_from = 0;
    while (pos < len && !rc) {
        size_t left = WAL_BLOCK - pos % WAL_BLOCK;
        if (left < WAL_HEADER) {
            pos += left;
            continue;
        }
        if (len - pos < WAL_HEADER) break;
        const uint8_t *h = buf + pos;
        wal_hdr hd = hdr_read(h);
        uint32_t crc = hd.crc;
        size_t n = hd.n;
        uint8_t type = hd.type;
        if (hdr_is_padding(&hd)) {
            pos += WAL_HEADER;
            continue;
        }
        if (WAL_HEADER + n > left || pos + WAL_HEADER + n > len ||
            crc32c(0, h + 6, 1 + n) != crc_unmask(crc) || type < REC_FULL || type > REC_LAST) {
            if (pos + WAL_HEADER + n > len && len - pos <= left) break; /* unfinished at the end */
            size_t skip = left < len - pos ? left : len - pos;
            st->bytes_dropped += skip + (in_rec ? pos - rec_from : 0);
            st->writes_dropped += in_rec;
            st->damaged++;
            in_rec = 0;
            pos += skip;
            continue;
        }
        const uint8_t *payload = h + WAL_HEADER;
        if ((type == REC_FULL || type == REC_FIRST) && in_rec) { /* a write left unfinished */
            st->bytes_dropped += pos - rec_from;
            st->writes_dropped++;
            in_rec = 0;
        }
        switch (type) {
        case REC_FULL:
            rc = emit_record(out, payload, n);
            st->writes_kept++;
            break;
        case REC_FIRST:
            rec.len = 0;
            rc = cp_buf_append(&rec, payload, n);
            in_rec = 1;
            rec_from = pos;
            break;
        case REC_MIDDLE:
        case REC_LAST:
            if (!in_rec) { /* the rest of a write whose start was damaged */
                st->bytes_dropped += WAL_HEADER + n;
                break;
            }
            rc = cp_buf_append(&rec, payload, n);
            if (!rc && type == REC_LAST) {
                rc = emit_record(out, rec.data, rec.len);
                st->writes_kept++;
                in_rec = 0;
            }
            break;
        }
        pos += WAL_HEADER + n;
    }
    if (!rc && pos < len) st->bytes_dropped += len - pos;
    if (!rc && in_rec) {
        st->bytes_dropped += pos - rec_from;
        st->writes_dropped++;
    }
    cp_buf_close(&rec);
    return rc;
}

int cp_wal_salvage(const char *dir, const char *file, cp_wal_salvage_stats *st, cp_err *err)
{
    crc_init();
    memset(st, 0, sizeof *st);
    char path[4352], tmp[4400], lost[4400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cp_buf in = {0}, out = {0};
    if (cp_read_file(path, &in, NULL))
        return cp_err_set(err, CP_EIO, "store %s: cannot read %s: %s", dir, file, strerror(errno));
    int rc = salvage(in.data, in.len, &out, st);
    cp_buf_close(&in);
    if (rc) {
        cp_buf_close(&out);
        return cp_err_set(err, rc, "store %s: salvaging %s", dir, file);
    }
    /* the damaged original is kept under lost/, where LevelDB's repair keeps what it drops */
    snprintf(lost, sizeof lost, "%s/lost", dir);
    mkdir(lost, 0755);
    snprintf(lost, sizeof lost, "%s/lost/%s.damaged", dir, file);
    snprintf(tmp, sizeof tmp, "%s.salvage", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(out.data, 1, out.len, f) == out.len;
    if (f && fflush(f)) ok = 0;
    if (f && fsync(fileno(f))) ok = 0;
    if (f && fclose(f)) ok = 0;
    cp_buf_close(&out);
    if (!ok || rename(path, lost) || rename(tmp, path)) {
        rc = cp_err_set(err, CP_EIO, "store %s: writing the salvaged %s: %s", dir, file,
                        strerror(errno));
        unlink(tmp);
    }
    return rc;
}
