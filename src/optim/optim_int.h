/* optim_int.h - the optimizer a range at a time, for engines whose parameters are not all decayed
 * alike (GPT's weight decay on matrices only); not part of the public interface. */
#ifndef TALLY_OPTIM_OPTIM_INT_H
#define TALLY_OPTIM_OPTIM_INT_H

#include <stddef.h>
#include <tally/optim.h>

/* Updates elements [begin, end) of o's n, as tally_optim_step would, with the weight decay of o's cfg
 * when decay is nonzero and none otherwise; params and grads point at element 0. Does not count the
 * step: call tally__optim_count_step once every range of the step has been updated. Each element's
 * update is the one tally_optim_step computes, bit for bit. */
void tally__optim_step_range(tally_optim *o, float *params, const float *grads, size_t begin, size_t end, float lr,
                             int decay);
void tally__optim_count_step(tally_optim *o);

#endif
