/* env.h - typed, strict reads of environment variables through the one parser (parse.h): a value that is
 * set must be valid, or the read fails with TALLY_E_INVALID naming the variable. The library's one reader
 * (tally_config_from_env) and the CLI's own variables use them. */
#ifndef TALLY_CORE_ENV_H
#define TALLY_CORE_ENV_H

#include <stddef.h>
#include <stdint.h>

/* NULL when unset or empty: for the launchers' own variables (RANK, OMPI_*, SLURM_*), where an empty
 * one means "not this launcher". */
const char *tally__env_str(const char *name);
/* The value of a TALLY_* knob as set: NULL when unset; "" when set empty, which the readers below refuse. */
const char *tally__env_knob(const char *name);
/* Unset: *out = def. Set: parsed strictly (parse.h), in range, or TALLY_E_INVALID. */
int tally__env_int(const char *name, long long lo, long long hi, long long def, long long *out);
int tally__env_real(const char *name, double lo, int lo_open, double hi, double def, double *out);
int tally__env_bytes(const char *name, uint64_t lo, uint64_t hi, uint64_t def, uint64_t *out);
/* The most seconds a timeout may be (tally_config.timeout and boot_timeout, the CLI's --timeout). */
#define TALLY__TIMEOUT_MAX_S 1e6

#endif
