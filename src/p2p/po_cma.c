/* po_cma.c - large payloads of a peer on this host read straight from its memory (process_vm_readv), so
 * they cross no socket buffer: the probe that says whether it can, the read, and the acks that free them. */
#include "po_int.h"

int tally__po_cma_probe(tally__po *po, const tally__po_hello *h) {
    (void)po;
    (void)h;
    return 0;
}

int tally__po_cma_read(tally__po *po, tally__po_in *in, tally__po_msg *m) {
    (void)in;
    tally__po_msg_lost(po, m, TALLY_E_PROTOCOL, "a message to be read in place");
    return 0;
}

int tally__po_cma_flush(tally__po *po, tally__po_in *in) {
    (void)po;
    (void)in;
    return 0;
}
