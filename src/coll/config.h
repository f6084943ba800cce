/* config.h - tally_config inside the library: taken from the caller (copied, checked once, naming the
 * field), the bounds its reader and its checks share, and what the communicator reads of it. */
#ifndef TALLY_COLL_CONFIG_H
#define TALLY_COLL_CONFIG_H

#include <tally.h>

/* Bounds of the fields, for the reader (config_env.c) and the checks (config.c) alike; the others are
 * their owners' (TALLY__TIMEOUT_MAX_S, TALLY__BOOT_MAX_SIZE, TALLY__TCP_STREAMS_MAX, TALLY__FLIGHT_MAX,
 * TALLY__TRACE_MAX). */
#define TALLY__SHM_LARGE_MAX    (1LL << 40)
#define TALLY__COST_MAX         1e12
#define TALLY__FLIGHT_DIR_MAX   448  /* characters of tally_config.flight_dir */
#define TALLY__TRACE_FILE_MAX   1023 /* characters of tally_config.trace_file */
#define TALLY__TRACE_EVENTS_MIN 1024

/* 0, or TALLY_E_INVALID (naming fn) when cfg is NULL or its struct_size and version are not a struct
 * this library knows (TALLY_CONFIG_INIT sets them). */
int tally__config_check_header(const tally_config *cfg, const char *fn);
/* Copies *in into *out within in->struct_size (the fields an older caller does not know keep their
 * defaults) and checks every field: 0, or TALLY_E_INVALID naming the field ("tally_config.timeout='0'
 * is out of range: ..."), prefixed with the rank when that is valid. */
int tally__config_take(const tally_config *in, tally_config *out);

/* The checks of the fields that are words or paths, shared with the reader: `name` is the field or the
 * variable the value came from; 0 or TALLY_E_INVALID with parse.c's message shape. */
int tally__config_check_algo(const char *name, const char *s);
int tally__config_check_path(const char *name, const char *s, size_t max, const char *what);

/* The algorithm the config forces (TALLY__ALGO_AUTO when none); the config was checked. */
int tally__config_algo(const tally_config *cfg);
/* The system's directory for temporary files: $TMPDIR, or /tmp (config_env.c, which reads the
 * environment; the flight recorder's default place). */
const char *tally__tmpdir(void);

#endif
