/* env.c - environment variables read strictly through parse.c, with defaults when unset: the helpers of
 * the library's one reader (tally_config_from_env) and of the CLI. */
#include "env.h"

#include <stdlib.h>

#include "parse.h"

const char *tally__env_str(const char *name) {
    const char *s = getenv(name);
    return (s && *s) ? s : NULL;
}

const char *tally__env_knob(const char *name) { return getenv(name); }

int tally__env_int(const char *name, long long lo, long long hi, long long def, long long *out) {
    const char *s = tally__env_knob(name);
    if (!s) return *out = def, 0;
    return tally__parse_int(name, s, lo, hi, out);
}

int tally__env_real(const char *name, double lo, int lo_open, double hi, double def, double *out) {
    const char *s = tally__env_knob(name);
    if (!s) return *out = def, 0;
    return tally__parse_real(name, s, lo, lo_open, hi, out);
}

int tally__env_bytes(const char *name, uint64_t lo, uint64_t hi, uint64_t def, uint64_t *out) {
    const char *s = tally__env_knob(name);
    if (!s) return *out = def, 0;
    return tally__parse_bytes(name, s, lo, hi, out);
}
