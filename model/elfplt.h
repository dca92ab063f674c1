/* x86-64 PLT stubs: which sections hold them and which GOT slot each jumps through, the way
 * binutils names them `func@plt` (elf_x86_64_get_synthetic_symtab). Used by elfread.c for
 * the agent's and the server's tables: without it a pc in a stub takes the name of the
 * nearest symbol before it, usually `_init`. Pure functions. */
#ifndef CP_ELFPLT_H
#define CP_ELFPLT_H

#include <stddef.h>
#include <stdint.h>

/* The name a stub gets when its target is unknown (PLT0, a lazy-binding entry of .plt next
 * to .plt.sec, an IRELATIVE slot). */
#define CP_PLT_UNNAMED "[plt]"

/* The size of one stub in section name (".plt", ".plt.sec", ".plt.got"), entsize its
 * sh_entsize; 0 if the section holds no stubs. */
uint32_t cp_plt_entry_size(const char *name, uint64_t entsize);

/* The GOT slot the stub e[0..n) at address addr jumps through: finds `jmp *disp32(%rip)`
 * (ff 25, possibly after endbr64 and a bnd prefix) and returns 0 with *got, or -1. */
int cp_plt_entry_got(const uint8_t *e, size_t n, uint64_t addr, uint64_t *got);

/* Relocation types naming a GOT slot's symbol: JUMP_SLOT (.rela.plt) and GLOB_DAT
 * (.rela.dyn, for .plt.got). */
int cp_plt_reloc_names_slot(uint32_t type);

#endif
