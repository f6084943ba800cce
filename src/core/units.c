/* units.c - numbers with units for the planner's and the simulator's flags and files: counts with SI
 * prefixes, rates in bits or bytes per second, times, FLOP rates. */
#include "units.h"

#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "parse.h"

/* The number at the start of s; *rest points after it. -1 when there is none or it is not finite. */
static int parse_number(const char *s, double *v, const char **rest) {
    int overflow;
    const char *end = s ? tally__parse_real_prefix(s, v, &overflow) : NULL;
    if (!end || overflow || !isfinite(*v) || *v < 0) return -1;
    *rest = end;
    return 0;
}

/* An SI prefix letter (K M G T, either case); 'i' after it makes it binary. Advances *u past it. */
static double parse_prefix(const char **u) {
    static const char letters[] = "KMGT";
    const char *at = **u ? strchr(letters, toupper((unsigned char)**u)) : NULL;
    if (!at) return 1;
    int k = (int)(at - letters) + 1;
    (*u)++;
    if (**u == 'i') {
        (*u)++;
        return pow(1024.0, k);
    }
    return pow(1000.0, k);
}

static int one_of(const char *u, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(u, *list)) return 1;
    return 0;
}

int tally__units_count(const char *s, double *out) {
    double v;
    const char *u;
    if (parse_number(s, &v, &u)) return -1;
    double mult = parse_prefix(&u);
    if (*u || !isfinite(v * mult)) return -1;
    *out = v * mult;
    return 0;
}

int tally__units_rate(const char *s, double *bytes_per_s) {
    static const char *const bits[] = {"bps", "b/s", "bit/s", "bits/s", NULL};
    static const char *const bytes[] = {"Bps", "B/s", "byte/s", "bytes/s", NULL};
    double v;
    const char *u;
    if (parse_number(s, &v, &u)) return -1;
    const char *p = u;
    double mult = parse_prefix(&u);
    if (one_of(u, bits))
        mult /= 8;
    else if (!one_of(u, bytes) && !(*u == 0 && u == p))
        return -1; /* "25G" alone: bits or bytes? */
    *bytes_per_s = v * mult;
    return v > 0 && isfinite(*bytes_per_s) ? 0 : -1;
}

int tally__units_time(const char *s, double *seconds) {
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"\xc2\xb5s", 1e-6}, {"ns", 1e-9}};
    double v;
    const char *u;
    if (parse_number(s, &v, &u)) return -1;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(u, units[i].unit)) return *seconds = v * units[i].mult, 0;
    return -1;
}

int tally__units_gflops(const char *s, double *gflops) {
    double v;
    const char *u;
    if (parse_number(s, &v, &u)) return -1;
    const char *p = u;
    double mult = parse_prefix(&u);
    if (u == p) mult = *u ? 1.0 : 1e9; /* a bare number is GFLOP/s */
    if (*u && strcasecmp(u, "flops") && strcasecmp(u, "flop/s")) return -1;
    *gflops = v * mult / 1e9;
    return v > 0 && isfinite(*gflops) ? 0 : -1;
}
