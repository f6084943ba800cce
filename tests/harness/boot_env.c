/* boot_env.c - the config and boot env a test's rank starts from, as tally_comm_init makes them. */
#include "boot_env.h"

int th_boot_env(tally_config *cfg, tally__boot_env *env) {
    *cfg = (tally_config)TALLY_CONFIG_INIT;
    int rc = tally_config_from_env(cfg);
    return rc ? rc : tally__boot_env_from_config(cfg, env);
}
