/* The streaming merger: profiles go in one by one, one merged profile comes out. Follows
 * pprof's merge rules; costs O(total input size), whatever the number of inputs. */
#ifndef CP_MERGE_H
#define CP_MERGE_H

#include "profile.h"

typedef struct cp_merger cp_merger;

/* Returns a new merger or NULL on out of memory (the NULL-or-object constructor: error.h,
 * "Exceptions"). */
cp_merger *cp_merger_create(void);
/* Frees the merger and, if not taken by finish, the profile it was building. */
void cp_merger_destroy(cp_merger *m);

/* Adds p (not retained; the caller keeps ownership). The first non-empty profile fixes the
 * sample types and period type; a later one that differs gets CP_EINCOMPAT naming the
 * difference, and the merger is unchanged. A profile with no sample types is neutral.
 * Mappings, functions and locations are deduplicated by content, samples with the same
 * stack and labels have their values summed; duration_nanos is summed, time_nanos is the
 * earliest nonzero, period is the largest. */
int cp_merger_add(cp_merger *m, const cp_profile *p, cp_err *err);

/* Like cp_merger_add, with every value multiplied by factor first (factor -1 subtracts,
 * as pprof's -base does). */
int cp_merger_add_scaled(cp_merger *m, const cp_profile *p, double factor, cp_err *err);

/* Number of profiles added so far (neutral ones included). */
uint32_t cp_merger_count(const cp_merger *m);

/* Hands the merged profile to the caller (samples whose values are all zero removed) and
 * leaves the merger empty, ready for reuse. Never NULL unless out of memory. */
cp_profile *cp_merger_finish(cp_merger *m);

#endif
