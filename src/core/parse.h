/* parse.h - the one strict parser of numbers, sizes and words for every flag and TALLY_* variable:
 * the whole string, finite, in range, or TALLY_E_INVALID with a message naming it and what it takes. */
#ifndef TALLY_CORE_PARSE_H
#define TALLY_CORE_PARSE_H

#include <stdint.h>

/* `name` is the flag ("--epochs", "-n") or the variable ("TALLY_TIMEOUT") the value came from; the
 * message reads "--epochs '-1' is out of range: it takes a whole number in 1..1000000" or
 * "TALLY_TIMEOUT='abc' is not a number: ...". Each returns 0, or TALLY_E_INVALID with that message set
 * (tally_last_error); *out is written only on success. Nothing is skipped: no leading or trailing
 * spaces, no junk after the number, no empty string, no NaN or Inf, no overflow. */

/* A decimal whole number (optional sign) in [lo, hi]. */
int tally__parse_int(const char *name, const char *s, long long lo, long long hi, long long *out);
/* Any value of a uint64_t, in decimal. */
int tally__parse_u64(const char *name, const char *s, uint64_t *out);
/* A finite decimal number in [lo, hi], or (lo, hi] when lo_open. */
int tally__parse_real(const char *name, const char *s, double lo, int lo_open, double hi, double *out);
/* Bytes: a number with an optional K/M/G/T suffix (powers of 1024), then optional "i" and "B":
 * 4096, 64M, 1.5GiB, 256kb; a whole number of bytes in [lo, hi]. */
int tally__parse_bytes(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* One of the NULL-terminated `words` (exactly, case-sensitive); *out is its index. */
int tally__parse_word(const char *name, const char *s, const char *const *words, int *out);

/* The decimal number at the start of s, for a parser of numbers with units: the end of the number, or
 * NULL when s does not start with one (spaces, "nan", "inf", hexadecimal); *overflow when it is too large. */
const char *tally__parse_real_prefix(const char *s, double *v, int *overflow);

/* A value that failed a check of the caller's own: the same message shape, with the caller's words
 * for what is wrong and what is accepted. Returns TALLY_E_INVALID. */
int tally__parse_fail(const char *name, const char *s, const char *problem, const char *accepts);

#endif
