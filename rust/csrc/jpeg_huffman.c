/* Baseline Huffman decoding for shardstream's raw JPEG decodes: a drop-in for libjpeg-turbo's
 * own decode_mcu on single-scan, 8-bit, sequential Huffman JPEGs (nearly every photo).
 *
 * Why: entropy decoding is about half of a photo's decode once the IDCT, resize and colour
 * conversion are vectorised, and its cost is a chain: where each code starts depends on the
 * length of the one before. Here one lookup of the next SS_FAST_BITS bits of an AC code gives
 * one symbol, or two when both codes and their values lie in those bits (the short codes are the
 * frequent ones), with their values already cut out and sign-extended: a step writes two
 * coefficients without a branch on how many symbols it held. Only the end of a block, and codes
 * or values longer than the lookup, branch. The bit buffer is refilled eight bytes at a time
 * when those bytes hold no 0xFF, once per two steps rather than on a test that the data decides,
 * and the decoder's state stays in registers for a whole MCU. A table is built again only when
 * the image's Huffman table differs from the last image's.
 *
 * The contract is libjpeg's result or nothing: the coefficients written are exactly those
 * libjpeg's decoder writes. Anything outside the clean case (a bad Huffman code, data that ends
 * or hits a marker early, a restart marker out of place, stray or fill bytes before a marker, a
 * file cut short) is not handled here: the decoder gives up, and jpeg_raw.c decodes the image
 * again from its start with libjpeg's decoder, which warns or fails exactly as it always did. */
#include "jpeg_huffman.h"

#include <stdlib.h>
#include <string.h>

/* The wheels are built by GCC or Clang (Linux, macOS) and by MSVC (Windows). */
#if defined(_MSC_VER) && !defined(__clang__)
#define SS_LIKELY(x) (x)
#define SS_UNLIKELY(x) (x)
#define SS_BSWAP64(x) _byteswap_uint64(x)
#else
#define SS_LIKELY(x) __builtin_expect(!!(x), 1)
#define SS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SS_BSWAP64(x) __builtin_bswap64(x)
#endif

/* Eight bytes of data as a big-endian number: the first byte's bits on top. */
static inline uint64_t ss_load_be64(const uint8_t *p) {
  uint64_t word;
  memcpy(&word, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return word;
#else
  return SS_BSWAP64(word);
#endif
}

/* Bits one table lookup reads: codes up to this length (the common ones) decode in one step. */
#define SS_FAST_BITS 10
#define SS_FAST_SIZE (1 << SS_FAST_BITS)

/* A fast-table entry: 0 when the code is longer than SS_FAST_BITS (or invalid), else
 *   bits 0-4    the code's length
 *   bit  5      SS_END_OF_BLOCK: as an AC symbol, it ends the block
 *   bits 8-15   its symbol: run << 4 | size (the run of zeros and the value's bit count)
 *   bits 16-20  the code's length plus the value's bits: what decoding it consumes */
#define SS_END_OF_BLOCK 0x20

static int32_t ss_entry(int length, int symbol) {
  int size = symbol & 15, run = symbol >> 4;
  /* Any size-0 symbol but ZRL (0xF0) ends a block, as in libjpeg, not only 0x00. */
  int ends = size == 0 && run != 15;
  return ((length + size) << 16) | (symbol << 8) | (ends ? SS_END_OF_BLOCK : 0) | length;
}

/* An AC table's step entry: one lookup decodes one symbol, or two when both codes and their
 * values lie in the SS_FAST_BITS looked up (common: the short codes are the frequent ones).
 * A step writes two coefficients, at k + run and `second_offset` after that (0 when there is
 * one symbol: it writes the first value again), and goes on after the second:
 *   bits 0-5    bits consumed
 *   bit  6      SS_STEP_SLOW: the first code or its value goes past the lookup (or is bad)
 *   bit  7      SS_STEP_ENDS: the block ends after this step (an end-of-block symbol)
 *   bits 8-11   the first symbol's run of zeros
 *   bits 12-16  second_offset
 *   bits 32-47  the first value; bits 48-63 the second */
#define SS_STEP_SLOW 0x40
#define SS_STEP_ENDS 0x80

struct ss_huff_table {
  int32_t fast[SS_FAST_SIZE];
  uint64_t steps[SS_FAST_SIZE]; /* AC tables only */
  /* For codes longer than SS_FAST_BITS: canonical decoding (ITU T.81 F.2.2.3). */
  int32_t maxcode[17];   /* largest code of each length, -1 when none */
  int32_t valoffset[17]; /* index in huffval of a code of each length, minus the code */
  uint8_t huffval[256];
  /* The JHUFF_TBL the table was built from, to skip building it again for the next image when
   * it is the same (as encoders' standard tables are, image after image). */
  int built, has_steps;
  UINT8 source_bits[17];
  UINT8 source_values[256];
};

/* Zigzag to natural order, with 16 spare entries: a corrupt run can push the index past 63,
 * and libjpeg then writes coefficient 63 (jutils.c's jpeg_natural_order does the same). */
static const int ss_natural_order[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

/* The coefficient value of the code at the top of `buf` described by `entry`: its size bits,
 * after the code, sign-extended (ITU T.81 F.2.2.1); 0 for size 0. No branches: which sizes
 * come next is what the data is, so a branch on them mispredicts. */
static inline int ss_value(uint64_t buf, int32_t entry) {
  int size = (entry >> 8) & 15;
  uint32_t raw = (uint32_t)(((buf << (entry & 31)) >> 1) >> (63 - size));
  /* Values below half the size's range are negative: subtract 2^size - 1. */
  int32_t negative = (int32_t)(raw - ((1u << size) >> 1)) >> 31;
  return (int)raw - (negative & (int)((1u << size) - 1));
}

/* A step entry from its fields (the layout above). */
static uint64_t ss_step(int consumed, int ends, int run, int second_offset, int first, int second) {
  return (uint64_t)consumed | (ends ? SS_STEP_ENDS : 0) | (uint64_t)run << 8 |
         (uint64_t)second_offset << 12 | (uint64_t)(uint16_t)first << 32 |
         (uint64_t)(uint16_t)second << 48;
}

/* The step entries of an AC table, from its fast entries. */
static void ss_build_steps(struct ss_huff_table *t) {
  int index;
  if (t->has_steps) return;
  t->has_steps = 1;
  for (index = 0; index < SS_FAST_SIZE; index++) {
    int32_t first = t->fast[index], second;
    int used = (first >> 16) & 31, run, value, left;
    uint64_t bits = (uint64_t)index << (64 - SS_FAST_BITS);
    if (!first || used > SS_FAST_BITS) {
      t->steps[index] = SS_STEP_SLOW;
      continue;
    }
    if (first & SS_END_OF_BLOCK) {
      t->steps[index] = ss_step(used, 1, 0, 0, 0, 0);
      continue;
    }
    run = (first >> 12) & 15;
    value = ss_value(bits, first);
    left = SS_FAST_BITS - used;
    second = t->fast[(index << used) & (SS_FAST_SIZE - 1)];
    /* The bits after the first symbol hold the whole second one: a pair. */
    if (left > 0 && second && ((second >> 16) & 31) <= left) {
      int both = used + ((second >> 16) & 31);
      if (second & SS_END_OF_BLOCK)
        t->steps[index] = ss_step(both, 1, run, 0, value, value);
      else
        t->steps[index] = ss_step(both, 0, run, 1 + ((second >> 12) & 15), value,
                                  ss_value(bits << used, second));
      continue;
    }
    t->steps[index] = ss_step(used, 0, run, 0, value, value);
  }
}

/* Builds a decoding table from a JHUFF_TBL; 0 on success. libjpeg validated the table when the
 * scan started (jpeg_make_d_derived_tbl), so failing here only means it is one we do not take. */
static int ss_build_table(struct ss_huff_table *t, const JHUFF_TBL *src) {
  int length, i, count = 0;
  int32_t code = 0;
  if (t->built && !memcmp(t->source_bits, src->bits, sizeof t->source_bits) &&
      !memcmp(t->source_values, src->huffval, sizeof t->source_values))
    return 0;
  t->built = t->has_steps = 0;
  memset(t->fast, 0, sizeof t->fast);
  for (length = 1; length <= 16; length++) count += src->bits[length];
  if (count > 256) return -1;
  memcpy(t->huffval, src->huffval, (size_t)count);
  count = 0;
  for (length = 1; length <= 16; length++) {
    int n = src->bits[length];
    t->maxcode[length] = -1;
    if (n) {
      t->valoffset[length] = count - code;
      for (i = 0; i < n; i++, code++, count++) {
        int symbol = src->huffval[count];
        if (code >= (1 << length)) return -1; /* over-subscribed: no room for the code */
        if (length <= SS_FAST_BITS) {
          int spare = SS_FAST_BITS - length; /* bits after the code in a lookup */
          int32_t entry = ss_entry(length, symbol);
          int fill;
          for (fill = 0; fill < (1 << spare); fill++) t->fast[(code << spare) + fill] = entry;
        }
      }
      t->maxcode[length] = code - 1;
    }
    if (n && code >= (1 << length)) return -1; /* the all-ones code is not allowed (libjpeg) */
    code <<= 1;
  }
  memcpy(t->source_bits, src->bits, sizeof t->source_bits);
  memcpy(t->source_values, src->huffval, sizeof t->source_values);
  t->built = 1;
  return 0;
}

/* The bit reader, in locals of the decoding function so that they live in registers; these
 * macros work on `buf`, `bits`, `pos`, `end` and `ended` there. `buf` holds the next bits, most
 * significant first; `bits` is how many of them are data (negative once a decode has read past
 * the data); after `ended` (a marker or the end of the data was reached) zeros follow. */
#define SS_CONSUME(n) (buf <<= (n), bits -= (n))

/* Moves data bytes into the bit buffer one at a time until it holds at least 57 bits, stopping
 * at a marker or the end of the data. */
static void ss_refill_slow(struct ss_huff_state *s) {
  while (s->bits <= 56) {
    unsigned c;
    if (s->pos >= s->end) goto ended;
    c = *s->pos;
    if (c == 0xFF) {
      if (s->pos + 1 >= s->end || s->pos[1] != 0) goto ended; /* a marker: not ours to read */
      s->pos += 2;
    } else {
      s->pos += 1;
    }
    s->buf |= (uint64_t)c << (56 - s->bits);
    s->bits += 8;
  }
  return;
ended:
  s->ended = 1;
  s->buf = s->bits > 0 ? s->buf & ~(~(uint64_t)0 >> s->bits) : 0;
}

/* Makes sure at least 32 bits are buffered (enough for any code and its value bits), unless
 * the data ended: eight bytes at once when none of them is 0xFF (no stuffing, no marker). The
 * bytes past the ones counted in `bits` land in the buffer too; the next refill writes the
 * same bits over them. */
#define SS_REFILL()                                                                        \
  do {                                                                                     \
    if (bits < 32 && !ended) {                                                             \
      if (SS_LIKELY(end - pos >= 8)) {                                                     \
        uint64_t word_ = ss_load_be64(pos);                                                \
        /* No 0xFF byte among the eight: no zero byte in the inverse. */                  \
        uint64_t inverted_ = ~word_;                                                       \
        if (SS_LIKELY(!((inverted_ - 0x0101010101010101ULL) & ~inverted_ &                 \
                        0x8080808080808080ULL))) {                                         \
          buf |= word_ >> bits;                                                            \
          pos += (63 - bits) >> 3;                                                         \
          bits |= 56;                                                                      \
          break;                                                                           \
        }                                                                                  \
      }                                                                                    \
      s->buf = buf, s->bits = bits, s->pos = pos;                                          \
      ss_refill_slow(s);                                                                   \
      buf = s->buf, bits = s->bits, pos = s->pos, ended = s->ended;                        \
    }                                                                                      \
  } while (0)


/* One step of a block's AC coefficients: one or two symbols by the step table, or one the long
 * way when the table cannot (a long code or value, or a symbol that reaches the block's last
 * coefficient, after which no second symbol may be read). */
#define SS_AC_STEP()                                                                        \
  do {                                                                                      \
    uint64_t step_ = ac->steps[buf >> (64 - SS_FAST_BITS)];                                 \
    int first_ = k + (int)((step_ >> 8) & 15);                                              \
    if (SS_LIKELY(!(step_ & SS_STEP_SLOW) && first_ < 63)) {                                \
      int second_ = first_ + (int)((step_ >> 12) & 31);                                     \
      SS_CONSUME((int)(step_ & 63));                                                        \
      block[ss_natural_order[first_]] = (JCOEF)(int16_t)(step_ >> 32);                     \
      block[ss_natural_order[second_]] = (JCOEF)(int16_t)(step_ >> 48);                    \
      k = second_ + 1;                                                                      \
      if (step_ & SS_STEP_ENDS) goto next_block;                                            \
    } else {                                                                                \
      SS_REFILL();                                                                          \
      entry = ac->fast[buf >> (64 - SS_FAST_BITS)];                                         \
      if (SS_UNLIKELY(!entry) && (entry = ss_decode_long(buf, ac)) < 0) goto bad;           \
      if (entry & SS_END_OF_BLOCK) {                                                        \
        SS_CONSUME(entry & 31);                                                             \
        goto next_block;                                                                    \
      }                                                                                     \
      value = ss_value(buf, entry);                                                         \
      SS_CONSUME(entry >> 16);                                                              \
      k += (entry >> 12) & 15;                                                              \
      block[ss_natural_order[k]] = (JCOEF)value;                                            \
      k++;                                                                                  \
    }                                                                                       \
  } while (0)

/* A refill whatever the bit count (cheaper than a branch that the data decides). After the
 * data ended nothing is read, as in SS_REFILL(): zeros follow. */
#define SS_REFILL_ALWAYS()                                                                  \
  do {                                                                                      \
    if (SS_LIKELY(!ended && end - pos >= 8)) {                                              \
      uint64_t word_ = ss_load_be64(pos);                                                   \
      uint64_t inverted_ = ~word_;                                                          \
      if (SS_LIKELY(!((inverted_ - 0x0101010101010101ULL) & ~inverted_ &                    \
                      0x8080808080808080ULL))) {                                            \
        buf |= word_ >> bits;                                                               \
        pos += (63 - bits) >> 3;                                                            \
        bits |= 56;                                                                         \
        break;                                                                              \
      }                                                                                     \
    }                                                                                       \
    if (bits < 57 && !ended) {                                                              \
      s->buf = buf, s->bits = bits, s->pos = pos;                                           \
      ss_refill_slow(s);                                                                    \
      buf = s->buf, bits = s->bits, pos = s->pos, ended = s->ended;                         \
    }                                                                                       \
  } while (0)

/* The entry (as the fast table's) of a code longer than the fast table reaches, or -1 for a
 * bad code. */
static int32_t ss_decode_long(uint64_t buf, const struct ss_huff_table *t) {
  int length;
  uint32_t next = (uint32_t)(buf >> 48);
  for (length = SS_FAST_BITS + 1; length <= 16; length++) {
    int32_t code = (int32_t)(next >> (16 - length));
    if (code <= t->maxcode[length]) {
      int symbol = t->huffval[(code + t->valoffset[length]) & 0xFF];
      return ss_entry(length, symbol);
    }
  }
  return -1;
}

/* The blocks of one MCU: each block's DC difference is added to its component's prediction,
 * and its coefficients written into the block (which libjpeg zeroed) when `mcu` is not NULL.
 * Returns 0, or -1 at a bad code. */
static int ss_decode_blocks(struct ss_huff_state *s, JBLOCKROW *mcu) {
  uint64_t buf = s->buf;
  int bits = s->bits, ended = s->ended;
  const uint8_t *pos = s->pos;
  const uint8_t *const end = s->end;
  int blkn, k;
  JCOEF discard[DCTSIZE2]; /* where a skipped MCU's coefficients go */
  for (blkn = 0; blkn < s->blocks_in_mcu; blkn++) {
    int ci = s->membership[blkn];
    const struct ss_huff_table *dc = &s->dc[ci], *ac = &s->ac[ci];
    JCOEF *block = mcu ? mcu[blkn][0] : discard;
    int32_t entry;
    int value;
    SS_REFILL();
    entry = dc->fast[buf >> (64 - SS_FAST_BITS)];
    if (SS_UNLIKELY(!entry) && (entry = ss_decode_long(buf, dc)) < 0) goto bad;
    value = ss_value(buf, entry);
    SS_CONSUME(entry >> 16);
    /* libjpeg lets the DC sum wrap (its decode_mcu suppresses the overflow check). */
    s->last_dc[ci] = (int)((unsigned)s->last_dc[ci] + (unsigned)value);
    block[0] = (JCOEF)s->last_dc[ci];
    /* Two steps per refill: a fast step takes at most SS_FAST_BITS bits, a refill leaves at
     * least 57 (or the data ended, and zeros follow), and a slow step refills itself. */
    for (k = 1; k < 64;) {
      SS_REFILL_ALWAYS();
      SS_AC_STEP();
      if (k >= 64) break;
      SS_AC_STEP();
    }
  next_block:;
  }
  s->buf = buf, s->bits = bits, s->pos = pos, s->ended = ended;
  return 0;
bad:
  return -1;
}

/* At a restart interval's end: the padding bits are dropped and the expected RSTn marker read.
 * Returns 0, or -1 when the data there is anything else. */
static int ss_restart(struct ss_huff_state *s) {
  if (s->bits >= 8 || s->end - s->pos < 2 || s->pos[0] != 0xFF ||
      s->pos[1] != 0xD0 + s->next_restart)
    return -1;
  s->pos += 2;
  s->buf = 0;
  s->bits = 0;
  s->ended = 0;
  s->next_restart = (s->next_restart + 1) & 7;
  s->restarts_to_go = s->restart_interval;
  memset(s->last_dc, 0, sizeof s->last_dc);
  return 0;
}

size_t ss_huff_tables_size(void) {
  return SS_HUFF_MAX_COMPONENTS * sizeof(struct ss_huff_table);
}

int ss_huff_start(struct ss_huff_state *s, j_decompress_ptr cinfo) {
  int ci, blkn;
  if (cinfo->progressive_mode || cinfo->arith_code || jpeg_has_multiple_scans(cinfo) ||
      cinfo->data_precision != 8 || cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 ||
      cinfo->Al != 0 || cinfo->comps_in_scan != cinfo->num_components ||
      cinfo->comps_in_scan > SS_HUFF_MAX_COMPONENTS || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU ||
      cinfo->src == NULL || cinfo->unread_marker != 0)
    return -1;
  memset(s->last_dc, 0, sizeof s->last_dc);
  for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
    const jpeg_component_info *c = cinfo->cur_comp_info[ci];
    const JHUFF_TBL *dc = cinfo->dc_huff_tbl_ptrs[c->dc_tbl_no];
    const JHUFF_TBL *ac = cinfo->ac_huff_tbl_ptrs[c->ac_tbl_no];
    if (!dc || !ac || ss_build_table(&s->dc[ci], dc) || ss_build_table(&s->ac[ci], ac)) return -1;
    ss_build_steps(&s->ac[ci]);
  }
  for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) s->membership[blkn] = cinfo->MCU_membership[blkn];
  s->blocks_in_mcu = cinfo->blocks_in_MCU;
  s->mcus_left = (long)cinfo->MCUs_per_row * (long)cinfo->MCU_rows_in_scan;
  s->restart_interval = cinfo->restart_interval;
  s->restarts_to_go = cinfo->restart_interval;
  s->next_restart = 0;
  s->pos = cinfo->src->next_input_byte;
  s->end = s->pos + cinfo->src->bytes_in_buffer;
  s->buf = 0;
  s->bits = 0;
  s->ended = 0;
  return 0;
}

int ss_huff_decode_mcu(struct ss_huff_state *s, j_decompress_ptr cinfo, JBLOCKROW *mcu) {
  if (s->restart_interval) {
    if (s->restarts_to_go == 0 && ss_restart(s)) return -1;
    s->restarts_to_go--;
  }
  if (ss_decode_blocks(s, mcu)) return -1;
  /* Bits read past the data: libjpeg warns that the data ended early. */
  if (s->bits < 0) return -1;
  if (--s->mcus_left == 0) {
    /* The scan is over: only padding (under a byte) may be left, right before a marker, or
     * libjpeg would count stray bytes. (Fill bytes, FF FF, are left to libjpeg: its bit
     * reader and its marker reader read them differently.) */
    if (s->bits >= 8 || s->end - s->pos < 2 || s->pos[0] != 0xFF || s->pos[1] == 0 ||
        s->pos[1] == 0xFF)
      return -1;
  }
  /* Where libjpeg's marker reader goes on from (only meaningful after the last MCU). */
  cinfo->src->next_input_byte = s->pos;
  cinfo->src->bytes_in_buffer = (size_t)(s->end - s->pos);
  return 0;
}

int ss_huff_truncated(const struct ss_huff_state *s) {
  const uint8_t *p;
  if (s->end - s->pos >= 2 && s->end[-2] == 0xFF && s->end[-1] == 0xD9) return 0;
  for (p = s->pos; p + 1 < s->end; p++)
    if (p[0] == 0xFF && p[1] != 0 && p[1] != 0xFF) return 0;
  return 1;
}
