/* Baseline Huffman decoding for the raw JPEG decodes (jpeg_huffman.c): what jpeg_raw.c needs to
 * put it in place of libjpeg-turbo's own decode_mcu. */
#ifndef SS_JPEG_HUFFMAN_H
#define SS_JPEG_HUFFMAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "jpeglib.h"

#define SS_HUFF_MAX_COMPONENTS 3

struct ss_huff_table;

/* One scan's decoding state: its tables, DC predictions, restart count and bit reader. */
struct ss_huff_state {
  struct ss_huff_table *dc, *ac; /* SS_HUFF_MAX_COMPONENTS of each, per scan component */
  int last_dc[SS_HUFF_MAX_COMPONENTS];
  int membership[D_MAX_BLOCKS_IN_MCU]; /* scan component of each block of an MCU */
  int blocks_in_mcu;
  long mcus_left;
  unsigned restart_interval, restarts_to_go;
  int next_restart; /* n of the RSTn marker expected next */
  const uint8_t *pos, *end;
  uint64_t buf; /* the next bits, most significant first */
  int bits;     /* how many of them are data; negative once a decode read past the data */
  int ended;    /* a marker or the end of the data was reached: zeros follow */
};

/* Bytes of table memory ss_huff_start() needs at `dc` and `ac`, each. */
size_t ss_huff_tables_size(void);

/* Takes over the scan that jpeg_start_decompress() began: 0, or -1 when the image is not a
 * single-scan 8-bit sequential Huffman JPEG (libjpeg's own decoder then stays). */
int ss_huff_start(struct ss_huff_state *s, j_decompress_ptr cinfo);

/* Decodes the next MCU as libjpeg-turbo's decode_mcu does (into zeroed blocks; `mcu` may be
 * NULL to skip it). 0, or -1 when the data is not the clean case: the caller must then start
 * again with libjpeg's decoder, which reports the problem as it always has. */
int ss_huff_decode_mcu(struct ss_huff_state *s, j_decompress_ptr cinfo, JBLOCKROW *mcu);

/* Whether no marker follows the data read so far (the file was cut short). libjpeg's bit
 * reader reads a few bytes further ahead than it needs, and fails when that reaches the end of
 * the data; so a decode of ours that ends early, before the cut, is only libjpeg's result when
 * this is 0. */
int ss_huff_truncated(const struct ss_huff_state *s);

#endif
