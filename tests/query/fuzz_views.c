/* libFuzzer target: the CLI's JSON reader through every table view (series, labels,
 * timeline, diff), as if the input were a server's answer. */
#include <stdint.h>
#include <stdlib.h>

#include "views.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20) return 0;
    const char *j = (const char *)data;
    cp_buf out = {0};
    cp_err err = {0};
    cp_view_series(j, size, &out, &err);
    cp_view_labels(j, size, &out, &err);
    cp_view_timeline(j, size, &out, &err);
    cp_view_diff(j, size, 5, &out, &err);
    cp_buf_close(&out);
    return 0;
}
