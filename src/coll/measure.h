/* measure.h - measures the cost model's alpha, beta (ping-pong between ranks 0 and 1 on the transport
 * in use) and gamma (reduction speed) at init, and shares rank 0's figures so every rank chooses alike. */
#ifndef TALLY_COLL_MEASURE_H
#define TALLY_COLL_MEASURE_H

#include "../boot/boot.h"
#include "coll.h"

/* Collective. TALLY_COST="alpha_us,beta_GBps,gamma_GBps" replaces the measurement (for tests and
 * for modelling another machine). */
int tally__measure_cost(const tally__ctx *c, tally__boot *boot, tally__cost *out);
/* TALLY_COST, when set, is valid (checked at init on every rank; only rank 0's pair measures). */
int tally__cost_check_env(void);

#endif
