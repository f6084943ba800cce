/* fuzz_manifest.c - fuzz target for a checkpoint directory's LATEST: each input is the manifest's text;
 * a parse either refuses it (TALLY_E_CORRUPT naming LATEST) or fills one that formats back to the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ckpt/ckpt_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > CKPT_MANIFEST_MAX) return 0; /* the reader refuses those before parsing */
    char text[CKPT_MANIFEST_MAX + 1];
    memcpy(text, data, size);
    text[size] = '\0';
    ckpt_manifest m;
    int rc = tally__ckpt_manifest_parse(text, size, "fuzz-dir", &m);
    if (rc) {
        if (rc != TALLY_E_CORRUPT || !strstr(tally_last_error(), "fuzz-dir/LATEST")) {
            fprintf(stderr, "fuzz_manifest: refused with %d: %s\n", rc, tally_last_error());
            abort();
        }
        return 0;
    }
    /* Accepted: it names a checkpoint file of its own step, and is exactly what the writer would write. */
    int64_t step;
    char again[CKPT_MANIFEST_MAX];
    size_t n = tally__ckpt_manifest_format(&m, again, sizeof again);
    if (!tally__ckpt_file_parse(m.file, 0, &step) || step != m.step || n != size || memcmp(again, text, n)) {
        fprintf(stderr, "fuzz_manifest: accepted a manifest the writer would not write (file %s, step %lld)\n", m.file,
                (long long)m.step);
        abort();
    }
    return 0;
}
