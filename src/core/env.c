/* env.c - environment knobs: typed parsing with messages that name the variable, and size suffixes. */
#include "env.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#include "err.h"

const char *tally__env_str(const char *name) {
    const char *s = getenv(name);
    return (s && *s) ? s : NULL;
}

int tally__env_long(const char *name, long def, long *out) {
    const char *s = tally__env_str(name);
    *out = def;
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        return tally__seterr(TALLY_E_INVALID, "%s='%s' is not an integer", name, s);
    *out = v;
    return 0;
}

int tally__env_double(const char *name, double def, double *out) {
    const char *s = tally__env_str(name);
    *out = def;
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end)
        return tally__seterr(TALLY_E_INVALID, "%s='%s' is not a number", name, s);
    *out = v;
    return 0;
}

long long tally__parse_size(const char *s) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    return (long long)(v * mult);
}

double tally__timeout_s(void) {
    double t;
    if (tally__env_double("TALLY_TIMEOUT", 300.0, &t) != 0 || t <= 0) return 300.0;
    return t;
}
