/* lr_schedule.c - the learning rate of each update: a linear warmup, then constant, cosine or step
 * decay (the usual PyTorch recipes, computed in double), and the decay names. */
#include <tally/optim.h>

#include <math.h>
#include <string.h>

static const double pi = 3.14159265358979323846;

/* Ends at exactly lr on the last warmup step, so the decay starts where the ramp stops. */
static double warmup_lr(const tally_lr_schedule *s, long step) {
    return (double)s->lr * (double)(step + 1) / (double)s->warmup_steps;
}

static double cosine_lr(const tally_lr_schedule *s, long since, long warmup) {
    long span = s->total_steps - warmup;
    double progress = (double)since / (double)(span > 1 ? span : 1);
    if (progress > 1.0) progress = 1.0; /* past total_steps the rate stays at min_lr */
    double lr = s->lr, min_lr = s->min_lr;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(pi * progress));
}

static double step_lr(const tally_lr_schedule *s, long since) {
    if (s->step_every <= 0) return s->lr;
    return (double)s->lr * pow((double)s->step_gamma, (double)(since / s->step_every));
}

TALLY_API float tally_lr_at(const tally_lr_schedule *s, long step) {
    if (!s) return 0.0f;
    if (step < 0) step = 0; /* before the first update: the first update's rate */
    long warmup = s->warmup_steps > 0 ? s->warmup_steps : 0;
    if (step < warmup) return (float)warmup_lr(s, step);
    long since = step - warmup;
    switch (s->decay) {
    case TALLY_DECAY_COSINE: return (float)cosine_lr(s, since, warmup);
    case TALLY_DECAY_STEP: return (float)step_lr(s, since);
    case TALLY_DECAY_NONE: break;
    }
    return s->lr;
}

TALLY_API const char *tally_decay_name(tally_decay d) {
    switch (d) {
    case TALLY_DECAY_NONE: return "none";
    case TALLY_DECAY_COSINE: return "cosine";
    case TALLY_DECAY_STEP: return "step";
    }
    return "unknown";
}

TALLY_API int tally_decay_parse(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "none") == 0) return TALLY_DECAY_NONE;
    if (strcmp(name, "cosine") == 0) return TALLY_DECAY_COSINE;
    if (strcmp(name, "step") == 0) return TALLY_DECAY_STEP;
    return -1;
}
