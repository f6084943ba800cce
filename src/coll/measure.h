/* measure.h - measures the cost model's alpha, beta (ping-pong between ranks 0 and 1 on the transport
 * in use) and gamma (reduction speed) at init, and shares rank 0's figures so every rank chooses alike. */
#ifndef TALLY_COLL_MEASURE_H
#define TALLY_COLL_MEASURE_H

#include "../boot/boot.h"
#include "coll.h"

/* Collective. The config's cost (TALLY_COST="alpha_us,beta_GBps,gamma_GBps"), when given, replaces the
 * measurement (for tests and for modelling another machine). */
int tally__measure_cost(const tally__ctx *c, tally__boot *boot, const tally_config *cfg, tally__cost *out);

#endif
