/* The process's perf map (/tmp/perf-PID.map): "START SIZE NAME" lines, hex with or without
 * 0x, appended by the JIT as it compiles. Read incrementally (the offset kept, complete
 * lines only), bounded, never mmap'd; looked up by address, a later line winning over an
 * earlier one for an overlapping range. */
#include "perfmap.h"
#include "guard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

typedef struct pm_entry {
    uint64_t start, size;
    uint32_t name_off, name_len;
    uint64_t tag;
} pm_entry;

static struct {
    int found;
    uint64_t offset; /* bytes of the file consumed */
    pm_entry *e;     /* in file order: a higher index is newer */
    uint32_t n, cap;
    uint32_t *by_start; /* entry indexes sorted by (start, index) */
    char *names;
    uint32_t names_len, names_cap;
    uint64_t bad, dropped, bytes;
} pm;

/* ------------------------------------------------------------------------------------
 * Names */

static int is_digits(const char *s, const char *e)
{
    if (s >= e) return 0;
    for (; s < e; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

/* The decimal number in [s, e) (digits only, checked by the caller), saturated; never
 * reads past e (names are not NUL-terminated). */
static int64_t decimal(const char *s, const char *e)
{
    int64_t v = 0;
    for (; s < e; s++)
        v = v > (INT64_MAX - 9) / 10 ? INT64_MAX : v * 10 + (*s - '0');
    return v;
}

static void copy_cut(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = 0;
}

/* "FILE:LINE:COL" or "FILE:LINE" in [s, e): sets the file's end and the line. */
static int split_location(const char *s, const char *e, const char **file_end, int64_t *line)
{
    const char *c1 = NULL, *c2 = NULL;
    for (const char *p = e; p > s; p--)
        if (p[-1] == ':') {
            if (!c2)
                c2 = p - 1;
            else {
                c1 = p - 1;
                break;
            }
        }
    if (!c2) return 0;
    if (c1 && is_digits(c1 + 1, c2) && is_digits(c2 + 1, e)) {
        *file_end = c1;
        *line = decimal(c1 + 1, c2);
        return c1 > s;
    }
    if (is_digits(c2 + 1, e)) {
        *file_end = c2;
        *line = decimal(c2 + 1, e);
        return c2 > s;
    }
    return 0;
}

void cp_perfmap_split(const char *name, size_t len, cp_perfmap_name *out)
{
    static const char *const js[] = {"JS:", "LazyCompile:", "Function:", "Script:"};
    const char *s = name, *e = name + len;
    out->file[0] = 0;
    out->line = 0;
    size_t k = 0;
    for (; k < sizeof(js) / sizeof(js[0]); k++)
        if ((size_t)(e - s) >= strlen(js[k]) && memcmp(s, js[k], strlen(js[k])) == 0) break;
    if (k == sizeof(js) / sizeof(js[0])) {
        copy_cut(out->function, sizeof(out->function), s, len);
        return;
    }
    s += strlen(js[k]);
    /* the code's tier (V8: ~ interpreted, ^ baseline, + maglev, * turbofan, ' for a
     * context-specialized variant, an "o" before the tier for on-stack replacement), not
     * part of the name */
    if (e - s >= 2 && s[0] == 'o' && strchr("~*^+", s[1])) s++;
    while (s < e && strchr("~*^+'!", *s) && *s)
        s++;
    const char *sp = NULL;
    for (const char *p = e; p > s; p--)
        if (p[-1] == ' ') {
            sp = p - 1;
            break;
        }
    const char *fend;
    int64_t line;
    if (sp && split_location(sp + 1, e, &fend, &line)) {
        copy_cut(out->file, sizeof(out->file), sp + 1, (size_t)(fend - (sp + 1)));
        out->line = line;
        e = sp;
        while (e > s && e[-1] == ' ')
            e--;
    }
    if (e == s)
        copy_cut(out->function, sizeof(out->function), "(anonymous)", 11);
    else
        copy_cut(out->function, sizeof(out->function), s, (size_t)(e - s));
}

/* ------------------------------------------------------------------------------------
 * Reading */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A hex number at *p (0x optional), at most 16 digits; *p moves past it. */
static int parse_hex(const char **p, const char *e, uint64_t *v)
{
    const char *s = *p;
    if (e - s > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    uint64_t x = 0;
    int nd = 0;
    for (; s < e && hexval(*s) >= 0; s++, nd++) {
        if (nd == 16) return -1;
        x = x << 4 | (uint64_t)hexval(*s);
    }
    if (nd == 0) return -1;
    *v = x;
    *p = s;
    return 0;
}

static void reset_all(void)
{
    free(pm.e);
    free(pm.by_start);
    free(pm.names);
    int found = pm.found;
    memset(&pm, 0, sizeof(pm));
    pm.found = found;
}

static int add_line(const char *s, const char *e)
{
    while (e > s && (e[-1] == '\r' || e[-1] == ' '))
        e--;
    uint64_t start, size;
    if (parse_hex(&s, e, &start) != 0 || s == e || *s != ' ') return pm.bad++, 0;
    while (s < e && *s == ' ')
        s++;
    if (parse_hex(&s, e, &size) != 0 || s == e || *s != ' ') return pm.bad++, 0;
    while (s < e && *s == ' ')
        s++;
    if (s == e || size == 0 || start + size < start) return pm.bad++, 0;
    size_t nl = (size_t)(e - s);
    if (nl > 1024) nl = 1024;
    if (pm.n >= CP_PERFMAP_MAX_ENTRIES || pm.names_len + nl > CP_PERFMAP_MAX_NAMES)
        return pm.dropped++, 0;
    if (pm.n == pm.cap) {
        uint32_t nc = pm.cap ? pm.cap * 2 : 1024;
        pm_entry *ne = realloc(pm.e, (size_t)nc * sizeof(*ne));
        if (!ne) return CP_ENOMEM;
        pm.e = ne;
        uint32_t *nb = realloc(pm.by_start, (size_t)nc * sizeof(*nb));
        if (!nb) return CP_ENOMEM;
        pm.by_start = nb;
        pm.cap = nc;
    }
    if (pm.names_len + nl > pm.names_cap) {
        uint32_t nc = pm.names_cap ? pm.names_cap : 65536;
        while (nc < pm.names_len + nl)
            nc *= 2;
        char *nn = realloc(pm.names, nc);
        if (!nn) return CP_ENOMEM;
        pm.names = nn;
        pm.names_cap = nc;
    }
    /* a NUL or control byte (a damaged file) would cut or garble the name downstream */
    for (size_t k = 0; k < nl; k++)
        pm.names[pm.names_len + k] = (unsigned char)s[k] < 0x20 ? '?' : s[k];
    pm.e[pm.n] = (pm_entry){start, size, pm.names_len, (uint32_t)nl, 0};
    pm.names_len += (uint32_t)nl;
    pm.n++;
    return 0;
}

static int idx_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (pm.e[x].start != pm.e[y].start) return pm.e[x].start < pm.e[y].start ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Sorts the entries from old on and merges them into by_start[0..old). */
static int merge_new(uint32_t old)
{
    uint32_t k = pm.n - old;
    if (!k) return 0;
    uint32_t *tmp = malloc((size_t)k * sizeof(uint32_t));
    if (!tmp) return CP_ENOMEM;
    for (uint32_t i = 0; i < k; i++)
        tmp[i] = old + i;
    qsort(tmp, k, sizeof(uint32_t), idx_cmp);
    /* merge from the back into by_start (capacity pm.cap >= pm.n) */
    int64_t i = (int64_t)old - 1, j = (int64_t)k - 1, w = (int64_t)pm.n - 1;
    while (j >= 0) {
        if (i >= 0 && idx_cmp(&pm.by_start[i], &tmp[j]) > 0)
            pm.by_start[w--] = pm.by_start[i--];
        else
            pm.by_start[w--] = tmp[j--];
    }
    free(tmp);
    return 0;
}

int cp_perfmap_refresh(const char *path)
{
    CP_ASSERT_AGENT_THREAD();
    char def[64];
    if (!path) {
        snprintf(def, sizeof(def), "/tmp/perf-%d.map", (int)getpid());
        path = def;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOMEM ? CP_ENOMEM : CP_ENOTFOUND;
    pm.found = 1;
    struct stat st;
    int rc = 0;
    char *buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) goto out;
    uint64_t size = (uint64_t)st.st_size;
    if (size < pm.offset) reset_all(); /* truncated or replaced: read it again */
    if (size == pm.offset) goto out;
    uint64_t want = size - pm.offset;
    if (want > CP_PERFMAP_READ_MAX) want = CP_PERFMAP_READ_MAX;
    if (!(buf = malloc(want))) {
        rc = CP_ENOMEM;
        goto out;
    }
    uint64_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)(pm.offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    const char *last = NULL;
    for (uint64_t i = got; i > 0; i--)
        if (buf[i - 1] == '\n') {
            last = buf + i - 1;
            break;
        }
    if (!last) {
        /* no complete line: a line cut mid-write (read again later), or one longer than
         * the read bound (skipped) */
        if (got == CP_PERFMAP_READ_MAX) pm.offset += got, pm.bad++;
        goto out;
    }
    uint32_t old = pm.n;
    for (const char *s = buf; s <= last;) {
        const char *nl = memchr(s, '\n', (size_t)(last - s) + 1);
        if (nl > s && (rc = add_line(s, nl)) != 0) break;
        s = nl + 1;
    }
    if (rc == 0) {
        pm.offset += (uint64_t)(last - buf) + 1;
        pm.bytes += (uint64_t)(last - buf) + 1;
    }
    int mr = merge_new(old);
    if (mr) {
        /* the index is short of the new entries: start over next time */
        reset_all();
        rc = mr;
    }
out:
    free(buf);
    close(fd);
    return rc;
}

int cp_perfmap_lookup(uint64_t addr, const char **name, size_t *len, uint32_t *slot)
{
    CP_ASSERT_AGENT_THREAD();
    /* the last entry starting at or below addr */
    uint32_t lo = 0, hi = pm.n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pm.e[pm.by_start[mid]].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* overlapping ranges are rare (V8 keeps code in place with --perf-basic-prof): look
     * at a few entries below for one covering addr, the newest winning */
    int64_t best = -1;
    for (uint32_t k = 0; k < 32 && lo > k; k++) {
        uint32_t i = pm.by_start[lo - 1 - k];
        const pm_entry *x = &pm.e[i];
        if (addr - x->start < x->size && (int64_t)i > best) best = i;
    }
    if (best < 0) return CP_ENOTFOUND;
    const pm_entry *x = &pm.e[best];
    *name = pm.names + x->name_off;
    *len = x->name_len;
    *slot = (uint32_t)best;
    return 0;
}

uint64_t cp_perfmap_get_tag(uint32_t slot)
{
    return slot < pm.n ? pm.e[slot].tag : 0;
}

void cp_perfmap_set_tag(uint32_t slot, uint64_t tag)
{
    CP_ASSERT_AGENT_THREAD();
    if (slot < pm.n) pm.e[slot].tag = tag;
}

void cp_perfmap_get_stats(cp_perfmap_stats *st)
{
    *st = (cp_perfmap_stats){pm.found, pm.n, pm.bad, pm.dropped, pm.bytes};
}

void cp_perfmap_reset(void)
{
    CP_ASSERT_AGENT_THREAD();
    reset_all();
    pm.found = 0;
}

void cp_perfmap_abandon(void)
{
    memset(&pm, 0, sizeof(pm));
}

/* ------------------------------------------------------------------------------------
 * The flags behind the map. */

/* Notes flag a[0..n) in *perf or *native ("--" then the name, '_' read as '-'). */
static void v8_flag(const char *a, size_t n, int *perf, int *native)
{
    static const char *const perf_flags[] = {"perf-basic-prof", "perf-basic-prof-only-functions",
                                             "perf-prof"};
    static const char nat[] = "interpreted-frames-native-stack";
    char f[64];
    if (n < 3 || a[0] != '-' || a[1] != '-' || n - 2 >= sizeof(f)) return;
    for (size_t i = 2; i < n; i++)
        f[i - 2] = a[i] == '_' ? '-' : a[i];
    f[n - 2] = 0;
    for (size_t i = 0; i < sizeof(perf_flags) / sizeof(perf_flags[0]); i++)
        if (!strcmp(f, perf_flags[i])) *perf = 1;
    if (!strcmp(f, nat)) *native = 1;
    if (!strcmp(f, "no-interpreted-frames-native-stack")) *native = 0;
}

int cp_perfmap_needs_native_stack(const char *args, size_t len, const char *node_options)
{
    int perf = 0, native = 0;
    for (size_t i = 0; args && i < len;) {
        size_t n = 0;
        while (i + n < len && args[i + n])
            n++;
        v8_flag(args + i, n, &perf, &native);
        i += n + 1;
    }
    for (const char *p = node_options; p && *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = 0;
        while (p[n] && p[n] != ' ' && p[n] != '\t')
            n++;
        v8_flag(p, n, &perf, &native);
        p += n;
    }
    return perf && !native;
}
