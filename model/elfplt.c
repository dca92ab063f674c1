/* x86-64 PLT stubs (elfplt.h). */
#include "elfplt.h"

#include <string.h>

uint32_t cp_plt_entry_size(const char *name, uint64_t entsize)
{
    if (!strcmp(name, ".plt") || !strcmp(name, ".plt.sec"))
        return entsize == 16 || entsize == 0 ? 16 : 0; /* lazy .plt: 16 with or without IBT */
    if (!strcmp(name, ".plt.got")) return entsize == 8 || entsize == 16 ? (uint32_t)entsize : 8;
    return 0;
}

int cp_plt_entry_got(const uint8_t *e, size_t n, uint64_t addr, uint64_t *got)
{
    size_t p = 0;
    if (n >= 4 && e[0] == 0xf3 && e[1] == 0x0f && e[2] == 0x1e && e[3] == 0xfa) p = 4; /* endbr64 */
    if (p < n && e[p] == 0xf2) p++;                                                    /* bnd */
    if (p + 6 > n || e[p] != 0xff || e[p + 1] != 0x25) return -1;
    int32_t disp = (int32_t)((uint32_t)e[p + 2] | (uint32_t)e[p + 3] << 8 |
                             (uint32_t)e[p + 4] << 16 | (uint32_t)e[p + 5] << 24);
    *got = addr + p + 6 + (uint64_t)(int64_t)disp;
    return 0;
}

int cp_plt_reloc_names_slot(uint32_t type)
{
    return type == 7 /* R_X86_64_JUMP_SLOT */ || type == 6 /* R_X86_64_GLOB_DAT */;
}
