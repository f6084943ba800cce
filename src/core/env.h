/* env.h - typed reads of environment knobs, with validation messages that name the variable. */
#ifndef TALLY_CORE_ENV_H
#define TALLY_CORE_ENV_H

#include <stddef.h>

/* NULL when unset or empty. */
const char *tally__env_str(const char *name);
/* Parses an integer/double knob; returns 0 and stores `def` when unset, TALLY_E_INVALID (with a message
 * naming the variable) when set but malformed. */
int tally__env_long(const char *name, long def, long *out);
int tally__env_double(const char *name, double def, double *out);
/* Parses sizes with K/M/G suffixes (powers of 1024) and optional B: "64M", "1KiB", "4096". -1 if bad. */
long long tally__parse_size(const char *s);
/* The collective timeout in seconds: TALLY_TIMEOUT, default 300. */
double tally__timeout_s(void);

#endif
