/* fuzz_ckpt.c - fuzz target for the checkpoint loader: each input is a checkpoint image handed to
 * tally__ckpt_parse, which must reject anything malformed without reading or allocating past it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz.h"
#include "train/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tally__ckpt *c = NULL;
    int rc = tally__ckpt_parse(data, size, "fuzz-input", &c);
    if (rc > 0 || (rc == 0 && !c)) {
        fprintf(stderr, "fuzz_ckpt: tally__ckpt_parse returned %d with %s checkpoint\n", rc, c ? "a" : "no");
        abort();
    }
    if (rc == 0) tally__ckpt_close(c);
    return 0;
}
