/* Test helper: where a symbol of an ELF file lies in the file (libelf), to build profiles
 * whose unsymbolized frames server-side symbolization must name. */
#ifndef CP_TEST_ELFSYM_H
#define CP_TEST_ELFSYM_H

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

/* The file offset of symbol name in the ELF file at path, from its symbol table and program
 * headers (libelf). */
static inline uint64_t elf_symbol_offset(const char *path, const char *name)
{
    elf_version(EV_CURRENT);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    Elf *e = elf_begin(fd, ELF_C_READ, NULL);
    CHECK(e);
    uint64_t value = 0;
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_SYMTAB) continue;
        Elf_Data *d = elf_getdata(scn, NULL);
        for (size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; i++) {
            GElf_Sym sym;
            if (gelf_getsym(d, (int)i, &sym) &&
                strcmp(elf_strptr(e, sh.sh_link, sym.st_name), name) == 0)
                value = sym.st_value;
        }
    }
    CHECK(value);
    size_t nph = 0;
    CHECK(elf_getphdrnum(e, &nph) == 0);
    uint64_t off = UINT64_MAX;
    for (size_t i = 0; i < nph; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(e, (int)i, &ph) && ph.p_type == PT_LOAD && value >= ph.p_vaddr &&
            value < ph.p_vaddr + ph.p_filesz)
            off = value - ph.p_vaddr + ph.p_offset;
    }
    elf_end(e);
    close(fd);
    CHECK(off != UINT64_MAX);
    return off;
}

#endif
