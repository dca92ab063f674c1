/* Runs a fuzz target over files given on the command line (its seed corpus), so normal and
 * sanitizer builds exercise the corpus as a plain test. */
#include <stdint.h>
#include <stdio.h>

#include "vec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        cp_buf b = {0};
        if (cp_read_file(argv[i], &b, NULL)) {
            fprintf(stderr, "cannot read %s\n", argv[i]);
            return 1;
        }
        LLVMFuzzerTestOneInput(b.data, b.len);
        cp_buf_close(&b);
    }
    printf("%d inputs\n", argc - 1);
    return 0;
}
