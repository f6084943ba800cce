/* fuzz.h - what the fuzz targets and the seed generator agree on: how each target reads the first
 * bytes of an input (which decoder, which parameters), and the live handshake target's world. */
#ifndef TALLY_FUZZ_FUZZ_H
#define TALLY_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* fuzz_frame: byte 0 % FZ_FRAME_MODES picks the decoder.
 *   TCP:   [1] elements per message, [2] dtype % 7, [3] op (% 4: sum prod min max; bit 2: plain copy,
 *          bit 3: reduce in place), then a data connection's byte stream: messages with WAIT and
 *          FAULT control frames between them (tcp_ctl.c).
 *   CTL:   [1] this rank % FZ_CTL_SIZE, then a control connection's byte stream.
 *   HELLO: the 160 bytes of a hello (zero-padded when shorter), judged by rank 0. */
enum { FZ_FRAME_TCP, FZ_FRAME_CTL, FZ_FRAME_HELLO, FZ_FRAME_MODES };
#define FZ_CTL_SIZE  4   /* world size of the control-frame mode; rank 2 is already joined */
#define FZ_HELLO_LEN 160 /* a hello's payload (HELLO_LEN in src/boot/boot.c) */
#define FZ_TCP_SEQ0  1   /* sequence number of the first message the TCP mode expects */

/* fuzz_handshake: byte 0 % FZ_HS_MODES: RAW sends the rest as the very first bytes (before any
 * proof); AUTH first proves the token, then sends the rest (hello, bootstrap frames, monitor frames).
 * The listener is rank 0 of a world of FZ_HS_SIZE, authenticating with FZ_HS_TOKEN. */
enum { FZ_HS_RAW, FZ_HS_AUTH, FZ_HS_MODES };
#define FZ_HS_SIZE  2
#define FZ_HS_TOKEN "tally-fuzz-handshake-token"

/* fuzz_idx: byte 0 % FZ_IDX_MODES: PLAIN writes the rest to a file named without .gz; GZ_RAW to a
 * file named .gz; GZ_WRAP gzips the rest first (level [1] % 10), so the IDX parser behind zlib is
 * reached too; FIFO and DIR read a FIFO (no writer: it must be refused, never waited on) or a directory
 * in the file's place, and HEADER reads the plain file's header alone (tally_idx_read_header). */
enum { FZ_IDX_PLAIN, FZ_IDX_GZ_RAW, FZ_IDX_GZ_WRAP, FZ_IDX_FIFO, FZ_IDX_DIR, FZ_IDX_HEADER, FZ_IDX_MODES };

/* fuzz_manifest: the whole input is the text of a checkpoint directory's LATEST. */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
