/* linear_ddp.c - least squares (y = x.w + b + noise, 8 features) trained data-parallel with tally's
 * embeddable engine: run it as `tally run -n 2 ./example_linear`, or under mpirun. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <tally.h>
#include <tally/data.h>
#include <tally/ddp.h>
#include <tally/layers.h>
#include <tally/optim.h>

#define F 8  /* features; the parameters are w[F] then b */
#define B 32 /* batch per rank */
#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        if ((call) < 0) {                                                                                              \
            fprintf(stderr, "%s\n", tally_last_error());                                                               \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

int main(void) {
    tally_comm *comm;
    CHECK(tally_comm_init(&comm));
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm);
    tally_dataset d;
    float true_w[F + 1], params[F + 1] = {0}, x[B * F], t[B], y[B], dy[B];
    CHECK(tally_dataset_linear(42, 16384, F, 0.1f, true_w, &d)); /* same seed: same data on every rank */
    float *grads = tally_mem_alloc(comm, sizeof params);         /* peers on this host read it in place */
    size_t layers[2] = {0, F + 1};                               /* one layer holding all parameters */
    tally_ddp *ddp;
    CHECK(tally_ddp_create(comm, grads, F + 1, layers, 1, NULL, &ddp));
    tally_optim_cfg oc;
    tally_optim opt;
    tally_sampler s;
    tally_optim_cfg_default(&oc, TALLY_OPTIM_SGD);
    CHECK(tally_optim_init(&opt, &oc, F + 1));
    CHECK(tally_sampler_init(&s, d.n, rank, size, 42, 1));
    for (int epoch = 0; epoch < 3; epoch++) {
        tally_sampler_set_epoch(&s, epoch);
        for (size_t i = 0; i + B <= tally_sampler_len(&s); i += B) {
            for (int j = 0; j < B; j++) {
                size_t k = tally_sampler_index(&s, i + j);
                memcpy(x + j * F, d.x + k * F, sizeof(float) * F);
                t[j] = d.t[k];
            }
            CHECK(tally_ddp_begin(ddp));
            tally_linear_forward(y, x, params, params + F, B, F, 1);
            tally_mse_backward(dy, y, t, B, 1);
            memset(grads, 0, sizeof params);
            tally_linear_backward(NULL, grads, grads + F, dy, x, params, B, F, 1);
            CHECK(tally_ddp_layer_ready(ddp, 0));
            CHECK(tally_ddp_wait(ddp)); /* grads now averaged over the ranks */
            tally_optim_step(&opt, params, grads, 0.01f);
        }
    }
    float err = 0;
    for (int i = 0; i <= F; i++) err = fmaxf(err, fabsf(params[i] - true_w[i]));
    if (rank == 0) printf("%d ranks: max |w - w_true| = %.4f\n", size, err);
    tally_ddp_free(ddp);
    tally_optim_free(&opt);
    tally_sampler_free(&s);
    tally_dataset_free(&d);
    tally_mem_free(comm, grads);
    tally_comm_free(comm);
    return err < 0.05f ? 0 : 1;
}
