/* parse.c - strict parsing of whole numbers, reals, byte sizes and words from flags and environment
 * variables, with one message shape that names the flag or variable, the value, and what it takes. */
#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* A flag is followed by a space ("--epochs '-1'"), a variable by '=' ("TALLY_TIMEOUT='abc'"). */
int tally__parse_fail(const char *name, const char *s, const char *problem, const char *accepts) {
    const char *sep = name[0] == '-' ? " " : "=";
    if (!s || !*s) return tally__seterr(TALLY_E_INVALID, "%s%s'' is empty: %s", name, sep, accepts);
    return tally__seterr(TALLY_E_INVALID, "%s%s'%.200s' %s: %s", name, sep, s, problem, accepts);
}

/* strto* skip leading spaces and accept "nan"/"inf": refuse what a person would not call a number. */
static int looks_numeric(const char *s) {
    const char *p = s + (*s == '+' || *s == '-');
    return *p && (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1])));
}

static int is_decimal_int(const char *s) {
    const char *p = s + (*s == '+' || *s == '-');
    if (!*p) return 0;
    for (; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    return 1;
}

int tally__parse_int(const char *name, const char *s, long long lo, long long hi, long long *out) {
    char accepts[96];
    snprintf(accepts, sizeof accepts, "it takes a whole number in %lld..%lld", lo, hi);
    if (!s || !*s) return tally__parse_fail(name, s, "", accepts);
    if (!is_decimal_int(s)) return tally__parse_fail(name, s, "is not a whole number", accepts);
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) return tally__parse_fail(name, s, "is out of range", accepts);
    *out = v;
    return 0;
}

int tally__parse_u64(const char *name, const char *s, uint64_t *out) {
    static const char accepts[] = "it takes a whole number in 0..18446744073709551615";
    if (!s || !*s) return tally__parse_fail(name, s, "", accepts);
    if (!is_decimal_int(s) || *s == '-') return tally__parse_fail(name, s, "is not a whole number >= 0", accepts);
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE) return tally__parse_fail(name, s, "is out of range", accepts);
    *out = (uint64_t)v;
    return 0;
}

const char *tally__parse_real_prefix(const char *s, double *v, int *overflow) {
    if (!looks_numeric(s)) return NULL;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    *overflow = errno == ERANGE && fabs(*v) > 1;
    /* Decimal only: strtod would also read hexadecimal ("0x10"). */
    return end == s || (size_t)(end - s) > strspn(s, "0123456789.eE+-") ? NULL : end;
}

int tally__parse_real(const char *name, const char *s, double lo, int lo_open, double hi, double *out) {
    char accepts[96];
    snprintf(accepts, sizeof accepts, "it takes a number in %c%.10g, %.10g]", lo_open ? '(' : '[', lo, hi);
    if (!s || !*s) return tally__parse_fail(name, s, "", accepts);
    double v;
    int overflow;
    const char *end = tally__parse_real_prefix(s, &v, &overflow);
    if (!end || *end) return tally__parse_fail(name, s, "is not a number", accepts);
    if (overflow || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi)
        return tally__parse_fail(name, s, "is out of range", accepts);
    *out = v;
    return 0;
}

/* K, M, G, T (either case) and the optional "i" and "B" after it; 0 when what follows is not a unit. */
static double bytes_unit(const char *u) {
    static const char letters[] = "KMGT";
    double mult = 1;
    const char *at = *u ? strchr(letters, toupper((unsigned char)*u)) : NULL;
    if (at) {
        mult = pow(1024.0, (double)(at - letters + 1));
        u++;
        if (*u == 'i' || *u == 'I') u++;
    }
    if (*u == 'B' || *u == 'b') u++;
    return *u ? 0 : mult;
}

static void bytes_text(uint64_t b, char *buf, size_t n) {
    static const char *const units[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (u < 4 && b >= 1024 && b % 1024 == 0) b /= 1024, u++;
    snprintf(buf, n, "%llu%s", (unsigned long long)b, units[u]);
}

int tally__parse_bytes(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char accepts[160], los[32], his[32];
    bytes_text(lo, los, sizeof los);
    bytes_text(hi, his, sizeof his);
    snprintf(accepts, sizeof accepts,
             "it takes a size in bytes from %s to %s, with K, M, G or T for powers of 1024 "
             "(4096, 64M, 1.5GiB)",
             los, his);
    if (!s || !*s) return tally__parse_fail(name, s, "", accepts);
    double v;
    int overflow;
    const char *end = tally__parse_real_prefix(s, &v, &overflow);
    double mult = end ? bytes_unit(end) : 0;
    if (!end || mult == 0 || *s == '-' || *s == '+') return tally__parse_fail(name, s, "is not a size", accepts);
    double bytes = v * mult;
    if (overflow || !isfinite(bytes) || bytes < (double)lo || bytes > (double)hi)
        return tally__parse_fail(name, s, "is out of range", accepts);
    if (bytes != floor(bytes)) return tally__parse_fail(name, s, "is not a whole number of bytes", accepts);
    *out = (uint64_t)bytes;
    return 0;
}

int tally__parse_word(const char *name, const char *s, const char *const *words, int *out) {
    char accepts[256] = "it takes ";
    size_t len = strlen(accepts);
    for (int i = 0; words[i] && len < sizeof accepts; i++)
        len += (size_t)snprintf(accepts + len, sizeof accepts - len, "%s%s",
                                i == 0         ? ""
                                : words[i + 1] ? ", "
                                               : " or ",
                                words[i]);
    for (int i = 0; s && words[i]; i++)
        if (!strcmp(s, words[i])) return *out = i, 0;
    return tally__parse_fail(name, s, "is not one of these", accepts);
}
