/* cmd_generate.c - `tally generate`: samples text from a model a `tally train --ckpt` run saved, and
 * prints the prompt and the bytes drawn as they come. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <tally.h>

#include "../src/core/err.h"
#include "../src/core/parse.h"
#include "../src/train/generate.h"
#include "cmd.h"
#include "flags.h"

typedef struct gen_opts {
    const char *dir, *prompt;
    tally__sample_cfg s;
} gen_opts;

static void gen_usage(FILE *out) {
    fprintf(out,
            "usage: tally generate --ckpt DIR [--prompt TEXT] [--tokens N] [--temperature X] [--top-k K]\n"
            "                      [--seed S]\n"
            "Samples text from the newest checkpoint in DIR of a model that reads text (a gpt that tally train\n"
            "saved there): the prompt, then N more bytes (default %d), each drawn from the softmax of the\n"
            "logits / temperature (default %g; 0: always the likeliest byte) over the K likeliest (default\n"
            "%d; 0: all), from the seed (default %d).\n",
            TALLY__SAMPLE_TOKENS_DEFAULT, TALLY__SAMPLE_TEMPERATURE_DEFAULT, TALLY__SAMPLE_TOP_K_DEFAULT,
            TALLY__SAMPLE_SEED_DEFAULT);
}

enum { G_CKPT = 256, G_PROMPT, G_TOKENS, G_TEMP, G_TOPK, G_SEED };
static const struct option gen_longs[] = {
    {"ckpt", 1, 0, G_CKPT},  {"prompt", 1, 0, G_PROMPT}, {"tokens", 1, 0, G_TOKENS}, {"temperature", 1, 0, G_TEMP},
    {"top-k", 1, 0, G_TOPK}, {"seed", 1, 0, G_SEED},     {"help", 0, 0, 'h'},        {0, 0, 0, 0}};

static int gen_flag(int ch, const char *flag, const char *a, void *ctx) {
    gen_opts *o = ctx;
    long long v;
    double x;
    switch (ch) {
    case G_CKPT:
        if (!*a) return tally__parse_fail(flag, a, "", "it takes a checkpoint directory");
        return o->dir = a, 0;
    case G_PROMPT: return o->prompt = a, 0;
    case G_TOKENS: return tally__parse_int(flag, a, 1, 1 << 24, &v) ? -1 : (o->s.tokens = (int)v, 0);
    case G_TEMP: return tally__parse_real(flag, a, 0, 0, 100, &x) ? -1 : (o->s.temperature = (float)x, 0);
    case G_TOPK: return tally__parse_int(flag, a, 0, 1 << 20, &v) ? -1 : (o->s.top_k = (int)v, 0);
    case G_SEED: return tally__parse_u64(flag, a, &o->s.seed);
    default: return -1;
    }
}

static void gen_emit(void *arg, int byte) {
    putchar(byte);
    fflush(stdout);
}

int tally_cmd_generate(int argc, char **argv) {
    gen_opts o = {.prompt = "",
                  .s = {.tokens = TALLY__SAMPLE_TOKENS_DEFAULT,
                        .temperature = TALLY__SAMPLE_TEMPERATURE_DEFAULT,
                        .top_k = TALLY__SAMPLE_TOP_K_DEFAULT,
                        .seed = TALLY__SAMPLE_SEED_DEFAULT}};
    const tally_flags f = {
        .cmd = "generate", .shorts = "h", .longs = gen_longs, .first = 1, .one = gen_flag, .usage = gen_usage};
    int rc = tally_flags_parse(&f, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (!o.dir) {
        tally_flags_usage_error("generate", "--ckpt DIR is required (the directory a tally train --ckpt run wrote)");
        return 2;
    }
    tally__model m;
    if (tally__generate_load(o.dir, &m)) {
        fprintf(stderr, "tally generate: %s\n", tally_last_error());
        return 1;
    }
    fputs(o.prompt, stdout);
    rc = tally__generate(&m, (const uint8_t *)o.prompt, strlen(o.prompt), &o.s, gen_emit, NULL);
    putchar('\n');
    tally__model_free(&m);
    if (rc) {
        fprintf(stderr, "tally generate: %s\n", tally_last_error());
        return 1;
    }
    return 0;
}
