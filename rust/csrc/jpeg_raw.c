/* Raw JPEG decoding for shardstream: the stored Y/Cb/Cr planes (not upsampled, not colour
 * converted) written straight into the caller's memory, stopping after the last row the caller
 * needs and transforming only the blocks it reads. TurboJPEG's planar decode can do neither,
 * and copies every row of a plane that is not a whole number of blocks wide; the libjpeg API
 * below it can do all three.
 *
 * The entropy decoding of single-scan baseline JPEGs is our own (jpeg_huffman.c, installed as
 * libjpeg's decode_mcu); when it meets anything but clean data it gives up, and the image is
 * decoded again from its start with libjpeg's decoder, which fails or warns as it always has.
 *
 * libjpeg reports errors by longjmp. Every libjpeg call is made from this file, under a setjmp
 * of the entry point that made it, so no jump ever crosses a Rust frame. */
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_huffman.h"
#include "jpeglib.h"

#define SS_MAX_COMPONENTS 3
/* Rows one jpeg_read_raw_data call writes per component: v_samp_factor (<= 4) times the
 * scaled block size (<= 8 when reducing). */
#define SS_MAX_ROWS_PER_CALL 32

struct ss_error {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  int failed;
  char message[JMSG_LENGTH_MAX];
};

/* libjpeg-turbo's inverse_DCT_method_ptr (jpegint.h). */
typedef void (*ss_idct_fn)(j_decompress_ptr cinfo, jpeg_component_info *compptr,
                           JCOEFPTR coef_block, JSAMPARRAY output_buf, JDIMENSION output_col);

struct ss_raw {
  struct jpeg_decompress_struct cinfo; /* first: the IDCT hook finds the rest from it */
  struct ss_error err;
  /* The IDCT libjpeg chose for each component, called by ss_idct_in_window() for the blocks
   * inside the component's window (samples [x0, x1) x [y0, y1) of the plane at `base`). */
  ss_idct_fn idct[SS_MAX_COMPONENTS];
  JSAMPLE *base[SS_MAX_COMPONENTS];
  ptrdiff_t stride[SS_MAX_COMPONENTS];
  long x0[SS_MAX_COMPONENTS], x1[SS_MAX_COMPONENTS];
  ptrdiff_t y0[SS_MAX_COMPONENTS], y1[SS_MAX_COMPONENTS]; /* as byte offsets of those rows */
  /* The image being decoded, kept to decode it again with libjpeg's entropy decoder. */
  const unsigned char *data;
  unsigned long len;
  int denom;
  struct ss_huff_state huff;
  int libjpeg_entropy_only; /* a test's choice: never install ours */
  int entropy;              /* which decoded the current image: an SS_ENTROPY_* */
  int entropy_gave_up;      /* set before the longjmp out of ss_decode_mcu */
};

/* Which entropy decoder decoded an image (ss_raw_entropy()). */
#define SS_ENTROPY_LIBJPEG 0  /* libjpeg's: the image is not single-scan baseline, or a test */
#define SS_ENTROPY_OURS 1     /* jpeg_huffman.c's */
#define SS_ENTROPY_REDONE 2   /* ours gave up, and libjpeg's decoded it again */

/* Kept in step with `Geometry` in jpeg_raw.rs. */
typedef struct {
  int components;
  int width, height;           /* output (luma) size at the chosen reduction */
  int plane_width[SS_MAX_COMPONENTS], plane_height[SS_MAX_COMPONENTS]; /* image data */
  int plane_stride[SS_MAX_COMPONENTS];      /* bytes libjpeg may write per row */
  int plane_rows[SS_MAX_COMPONENTS];        /* rows libjpeg may write in all */
  int plane_h_ratio[SS_MAX_COMPONENTS], plane_v_ratio[SS_MAX_COMPONENTS]; /* output px/sample */
} ss_raw_geometry;

/* The head of libjpeg-turbo's `struct jpeg_inverse_dct` (jpegint.h, an internal header that is
 * not installed): the per-component IDCT functions, which TurboJPEG's own planar decode swaps
 * exactly as ss_keep_chroma_subsampled() does. turbojpeg-sys pins the libjpeg-turbo version. */
struct ss_inverse_dct_head {
  void (*start_pass)(j_decompress_ptr cinfo);
  ss_idct_fn inverse_DCT[MAX_COMPONENTS];
};

/* The head of libjpeg-turbo's `struct jpeg_entropy_decoder` (jpegint.h), likewise. */
struct ss_entropy_head {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
};

static void ss_error_exit(j_common_ptr cinfo) {
  struct ss_error *err = (struct ss_error *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, err->message);
  err->failed = 1;
  longjmp(err->jump, 1);
}

/* libjpeg's warnings are corrupt data (a premature end, a bad Huffman code, stray bytes);
 * TurboJPEG fails on them, and so do we: the first is kept and the entry point fails. */
static void ss_emit_message(j_common_ptr cinfo, int level) {
  struct ss_error *err = (struct ss_error *)cinfo->err;
  if (level < 0 && !err->failed) {
    (*cinfo->err->format_message)(cinfo, err->message);
    err->failed = 1;
  }
}

struct ss_raw *ss_raw_new(void) {
  struct ss_raw *volatile h = (struct ss_raw *)calloc(1, sizeof(struct ss_raw));
  if (!h) return NULL;
  h->huff.dc = calloc(1, ss_huff_tables_size());
  h->huff.ac = calloc(1, ss_huff_tables_size());
  if (!h->huff.dc || !h->huff.ac) {
    free(h->huff.dc);
    free(h->huff.ac);
    free(h);
    return NULL;
  }
  h->cinfo.err = jpeg_std_error(&h->err.pub);
  h->err.pub.error_exit = ss_error_exit;
  h->err.pub.emit_message = ss_emit_message;
  if (setjmp(h->err.jump)) {
    free(h->huff.dc);
    free(h->huff.ac);
    free(h);
    return NULL;
  }
  jpeg_create_decompress(&h->cinfo);
  return h;
}

void ss_raw_free(struct ss_raw *h) {
  if (!h) return;
  jpeg_destroy_decompress(&h->cinfo);
  free(h->huff.dc);
  free(h->huff.ac);
  free(h);
}

const char *ss_raw_message(const struct ss_raw *h) { return h->err.message; }

static void ss_fail(struct ss_raw *h, const char *message) {
  snprintf(h->err.message, sizeof h->err.message, "%s", message);
  h->err.failed = 1;
  longjmp(h->err.jump, 1);
}

/* When reducing a 4:2:0 image, libjpeg decodes chroma with a larger IDCT so that its planes
 * come out at the reduced luma size (no upsampling needed). We resize chroma from its stored
 * resolution anyway, so that only costs time: a bigger IDCT and four times the chroma pixels to
 * resize. Give those components the luma's reduced IDCT back, as TurboJPEG does. */
static void ss_keep_chroma_subsampled(struct jpeg_decompress_struct *cinfo) {
  struct ss_inverse_dct_head *idct = (struct ss_inverse_dct_head *)cinfo->idct;
  int ci, reference = -1;
  for (ci = 0; ci < cinfo->num_components; ci++)
    if (cinfo->comp_info[ci].DCT_scaled_size == cinfo->min_DCT_scaled_size) reference = ci;
  if (reference < 0) return;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    jpeg_component_info *c = &cinfo->comp_info[ci];
    if (c->DCT_scaled_size == cinfo->min_DCT_scaled_size) continue;
    c->DCT_scaled_size = cinfo->min_DCT_scaled_size;
    c->MCU_sample_width = c->MCU_width * c->DCT_scaled_size;
    c->downsampled_width = (JDIMENSION)(((long)cinfo->image_width * c->h_samp_factor *
                                         c->DCT_scaled_size + cinfo->max_h_samp_factor * DCTSIZE - 1) /
                                        (cinfo->max_h_samp_factor * DCTSIZE));
    c->downsampled_height = (JDIMENSION)(((long)cinfo->image_height * c->v_samp_factor *
                                          c->DCT_scaled_size + cinfo->max_v_samp_factor * DCTSIZE - 1) /
                                         (cinfo->max_v_samp_factor * DCTSIZE));
    idct->inverse_DCT[ci] = idct->inverse_DCT[reference];
  }
}

/* Every block's IDCT goes through here: blocks outside the component's window are left
 * undecoded (their coefficients were still entropy-decoded: the bitstream is sequential). The
 * caller reads nothing outside the windows it gave. */
static void ss_idct_in_window(j_decompress_ptr cinfo, jpeg_component_info *compptr,
                              JCOEFPTR coef_block, JSAMPARRAY output_buf, JDIMENSION output_col) {
  struct ss_raw *h = (struct ss_raw *)cinfo;
  int ci = compptr->component_index;
  long size = compptr->DCT_scaled_size;
  long x = (long)output_col;
  ptrdiff_t y; /* the block's first row, as a byte offset (no division per block) */
  if (x + size <= h->x0[ci] || x >= h->x1[ci]) return;
  y = output_buf[0] - h->base[ci];
  if (y + size * h->stride[ci] <= h->y0[ci] || y >= h->y1[ci]) return;
  h->idct[ci](cinfo, compptr, coef_block, output_buf, output_col);
}

static void ss_hook_idct(struct ss_raw *h) {
  struct jpeg_decompress_struct *cinfo = &h->cinfo;
  struct ss_inverse_dct_head *idct = (struct ss_inverse_dct_head *)cinfo->idct;
  int ci;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    h->idct[ci] = idct->inverse_DCT[ci];
    idct->inverse_DCT[ci] = ss_idct_in_window;
  }
}

/* libjpeg's decode_mcu, replaced: our decoder, or, when it gives up, a jump back to
 * ss_raw_read_pass() to decode the image again with libjpeg's. */
static boolean ss_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *mcu) {
  struct ss_raw *h = (struct ss_raw *)cinfo;
  if (ss_huff_decode_mcu(&h->huff, cinfo, mcu)) {
    h->entropy_gave_up = 1;
    longjmp(h->err.jump, 1);
  }
  return TRUE;
}

static void ss_hook_entropy(struct ss_raw *h, int ours) {
  h->entropy = SS_ENTROPY_LIBJPEG;
  if (ours && !h->libjpeg_entropy_only && ss_huff_start(&h->huff, &h->cinfo) == 0) {
    ((struct ss_entropy_head *)h->cinfo.entropy)->decode_mcu = ss_decode_mcu;
    h->entropy = SS_ENTROPY_OURS;
  }
}

/* libjpeg keeps the DQT and DHT tables in a decompressor from one image to the next, for
 * abbreviated datastreams (tables sent once, images after them). Every image here is a whole
 * datastream: kept tables would decode a JPEG without DHT (the standard tables apply, as in
 * motion-JPEG frames) with the last image's optimized ones, and a JPEG without DQT, which must
 * fail, with the last image's quantization. So each image starts from a new decompressor: what
 * it becomes never depends on what its thread decoded before. A few microseconds: see
 * benches/bench_jpeg_renew.rs. Returns 0, or -1 when memory ran out (the caller drops h). */
int ss_raw_renew(struct ss_raw *h) {
  jpeg_destroy_decompress(&h->cinfo);
  if (setjmp(h->err.jump)) return -1;
  jpeg_create_decompress(&h->cinfo);
  return 0;
}

static int ss_raw_start_with(struct ss_raw *h, const unsigned char *data, unsigned long len,
                             int denom, ss_raw_geometry *geometry, int our_entropy) {
  struct jpeg_decompress_struct *cinfo = &h->cinfo;
  int ci;
  h->err.failed = 0;
  h->err.message[0] = 0;
  h->entropy_gave_up = 0;
  h->data = data;
  h->len = len;
  h->denom = denom;
  if (ss_raw_renew(h)) return -1;
  if (setjmp(h->err.jump)) {
    jpeg_abort_decompress(cinfo);
    return -1;
  }
  jpeg_mem_src(cinfo, data, len);
  jpeg_read_header(cinfo, TRUE);
  if (h->err.failed) longjmp(h->err.jump, 1);
  if (cinfo->num_components > SS_MAX_COMPONENTS ||
      (cinfo->jpeg_color_space != JCS_YCbCr && cinfo->jpeg_color_space != JCS_GRAYSCALE))
    ss_fail(h, "raw decoding takes YCbCr and grayscale JPEGs only");
  cinfo->raw_data_out = TRUE;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->scale_num = 1;
  cinfo->scale_denom = denom;
  jpeg_start_decompress(cinfo);
  if (h->err.failed) longjmp(h->err.jump, 1);
  ss_keep_chroma_subsampled(cinfo);
  ss_hook_idct(h);
  ss_hook_entropy(h, our_entropy);
  geometry->components = cinfo->num_components;
  geometry->width = cinfo->output_width;
  geometry->height = cinfo->output_height;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    jpeg_component_info *c = &cinfo->comp_info[ci];
    int rows_per_call = c->v_samp_factor * c->DCT_scaled_size;
    /* Whole MCUs of blocks: more than libjpeg writes, never less. */
    int blocks = (int)((c->width_in_blocks + c->h_samp_factor - 1) / c->h_samp_factor) *
                 c->h_samp_factor;
    int h_out = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
    int v_out = cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size;
    int h_plane = c->h_samp_factor * c->DCT_scaled_size;
    if (rows_per_call > SS_MAX_ROWS_PER_CALL || h_out % h_plane || v_out % rows_per_call)
      ss_fail(h, "unsupported sampling factors");
    geometry->plane_h_ratio[ci] = h_out / h_plane;
    geometry->plane_v_ratio[ci] = v_out / rows_per_call;
    geometry->plane_width[ci] = c->downsampled_width;
    geometry->plane_height[ci] = c->downsampled_height;
    geometry->plane_stride[ci] = blocks * c->DCT_scaled_size;
    geometry->plane_rows[ci] = (int)cinfo->total_iMCU_rows * rows_per_call;
  }
  return 0;
}

/* Reads the header of `data` and starts a raw decode reduced to 1/`denom` (1, 2, 4 or 8);
 * describes the planes in `geometry`. 0 on success; -1 with ss_raw_message() set. */
int ss_raw_start(struct ss_raw *h, const unsigned char *data, unsigned long len, int denom,
                 ss_raw_geometry *geometry) {
  return ss_raw_start_with(h, data, len, denom, geometry, 1);
}

/* One pass of ss_raw_read() over the started image: the output rows decoded, -1 with
 * ss_raw_message() set, or -2 when our entropy decoder gave up (the decode is aborted). */
static int ss_raw_read_pass(struct ss_raw *h, unsigned char *const *planes, const int *strides,
                            int last) {
  struct jpeg_decompress_struct *cinfo = &h->cinfo;
  JSAMPROW rows[SS_MAX_COMPONENTS][SS_MAX_ROWS_PER_CALL];
  JSAMPARRAY arrays[SS_MAX_COMPONENTS];
  int ci, r;
  if (setjmp(h->err.jump)) {
    jpeg_abort_decompress(cinfo);
    if (h->entropy_gave_up) return -2;
    return -1;
  }
  while ((int)cinfo->output_scanline < last) {
    int call = cinfo->output_scanline / (cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size);
    for (ci = 0; ci < cinfo->num_components; ci++) {
      jpeg_component_info *c = &cinfo->comp_info[ci];
      int per_call = c->v_samp_factor * c->DCT_scaled_size;
      for (r = 0; r < per_call; r++)
        rows[ci][r] = planes[ci] + (size_t)(call * per_call + r) * (size_t)strides[ci];
      arrays[ci] = rows[ci];
    }
    if (jpeg_read_raw_data(cinfo, arrays,
                           cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size) == 0)
      ss_fail(h, "JPEG decoding suspended");
    if (h->err.failed) longjmp(h->err.jump, 1);
  }
  r = (int)cinfo->output_scanline;
  if (r >= (int)cinfo->output_height) {
    jpeg_finish_decompress(cinfo);
    if (h->err.failed) longjmp(h->err.jump, 1);
  } else {
    jpeg_abort_decompress(cinfo);
    /* A cut-short file: whether libjpeg would have failed depends on how far it read ahead. */
    if (h->entropy == SS_ENTROPY_OURS && ss_huff_truncated(&h->huff)) return -2;
  }
  return r;
}

/* Decodes the started image into `planes` (rows `strides` apart, sized as the geometry says)
 * until at least `stop_row` output rows are done (0: all of them), then ends the decode:
 * reading on to the end marker when every row was decoded, abandoning the rest otherwise.
 * With `windows` (x0, x1, y0, y1 per component, in plane samples), only blocks that meet a
 * component's window are transformed to pixels; the rest of the plane is left as it was.
 * Returns the output rows decoded, or -1 with ss_raw_message() set. */
int ss_raw_read(struct ss_raw *h, unsigned char *const *planes, const int *strides,
                int stop_row, const int *windows) {
  struct jpeg_decompress_struct *cinfo = &h->cinfo;
  const int last = (stop_row <= 0 || stop_row > (int)cinfo->output_height)
                       ? (int)cinfo->output_height : stop_row;
  int ci, r;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    h->base[ci] = planes[ci];
    h->stride[ci] = (ptrdiff_t)strides[ci];
    h->x0[ci] = windows ? windows[4 * ci] : 0;
    h->x1[ci] = windows ? windows[4 * ci + 1] : 0x7fffffffL;
    h->y0[ci] = windows ? (ptrdiff_t)windows[4 * ci + 2] * h->stride[ci] : 0;
    h->y1[ci] = windows ? (ptrdiff_t)windows[4 * ci + 3] * h->stride[ci] : PTRDIFF_MAX;
  }
  r = ss_raw_read_pass(h, planes, strides, last);
  if (r == -2) {
    /* Our entropy decoder met something it leaves to libjpeg: start over with libjpeg's. */
    ss_raw_geometry again;
    if (ss_raw_start_with(h, h->data, h->len, h->denom, &again, 0)) return -1;
    h->entropy = SS_ENTROPY_REDONE;
    r = ss_raw_read_pass(h, planes, strides, last);
  }
  return r;
}

/* Ends a started decode that will not be read. */
void ss_raw_abort(struct ss_raw *h) { jpeg_abort_decompress(&h->cinfo); }

/* With `on`, images are entropy-decoded by libjpeg's decoder only (tests compare the two). */
void ss_raw_use_libjpeg_entropy(struct ss_raw *h, int on) { h->libjpeg_entropy_only = on; }

/* Which entropy decoder decoded the last image started: an SS_ENTROPY_* value. */
int ss_raw_entropy(const struct ss_raw *h) { return h->entropy; }
