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
        uint32_t crc = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                       (uint32_t)h[3] << 24;
        size_t n = (size_t)h[4] | (size_t)h[5] << 8;
        uint8_t type = h[6];
        if (type == REC_ZERO && n == 0 && crc == 0) {
            /* preallocated space (mmap writers): LevelDB skips it silently */
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
        if (cp_read_file(path, &b)) {
            rc = cp_err_set(err, CP_EIO, "store %s: cannot read %s: %s", dir, de->d_name,
                            strerror(errno));
            break;
        }
        cp_wal_report *r = &out[(*n)++];
        memset(r, 0, sizeof *r);
        snprintf(r->file, sizeof r->file, "%s", de->d_name);
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
