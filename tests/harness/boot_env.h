/* boot_env.h - where the tests of the layers under the communicator start: the config tally_comm_init
 * would make from this process's environment, and the rendezvous's part of it. */
#ifndef TALLY_TEST_BOOT_ENV_H
#define TALLY_TEST_BOOT_ENV_H

#include <tally.h>

#include "boot/boot.h"

/* tally_config_from_env into *cfg (kept: a transport made from it points at it), then the boot env; 0 or
 * the first failure's code, with its message. */
int th_boot_env(tally_config *cfg, tally__boot_env *env);

#endif
