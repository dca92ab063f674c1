/* Ingest's own functions that the module's tests call directly: each keeps the thread rule
 * it states (model/check.h), so tests/ingest/test_ingest_checks.c can break it on purpose. */
#ifndef CP_INGEST_INT_H
#define CP_INGEST_INT_H

#include <stdint.h>

#include "ingest.h"

/* Every 5 s (now: CLOCK_MONOTONIC ns): the windows stored per second since the last sample,
 * smoothed, for contprof_ingest_windows_per_second. Ingest thread only (run()'s loop, first
 * thing each turn): asserted, so from any other thread while ingest runs it aborts naming
 * itself in Debug and sanitizer builds. */
void cp_ingest_rate_tick(cp_ingest *in, int64_t now);

#endif
