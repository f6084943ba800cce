/* units.h - numbers with units, as the planner's and the simulator's flags and files take them: counts
 * (7.5G), rates (25Gbps, 10GB/s), times (5us), FLOP rates (100 GFLOPS). */
#ifndef TALLY_CORE_UNITS_H
#define TALLY_CORE_UNITS_H

/* Parsers (0, or -1 when malformed). Counts: K/M/G/T = 1e3..1e12 ("7.5G"). Rates: bits with "bps" or
 * "b/s" (Gbps = 1e9 bits/s), bytes with "B/s" or "Bps" (KB/MB/GB/TB decimal, KiB/MiB/GiB binary), to
 * bytes per second. Times: ns, us (or µs), ms, s; a bare number is seconds. FLOP rates: a bare number
 * is GFLOP/s, or with GFLOPS / TFLOPS / GFLOP/s; returns GFLOP/s. */
int tally__units_count(const char *s, double *out);
int tally__units_rate(const char *s, double *bytes_per_s);
int tally__units_time(const char *s, double *seconds);
int tally__units_gflops(const char *s, double *gflops);

#endif
