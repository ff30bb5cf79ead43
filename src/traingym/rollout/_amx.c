/* The built-in engine's bf16 kernels on AMX (rollout/amx.py wraps them; the fused decoder's
 * oneDNN and torch paths are the fallback and the reference): a linear, a sparse MoE block's
 * routed experts in one call, and one decode step's attention.
 *
 * Why: at decode batch sizes a bf16 matmul should cost reading its weight once, but oneDNN's
 * `_linear_pointwise` spends ~35 us of fixed cost per call on the machines this was built on (a
 * 64x64 matmul: benchmarks/amx_kernels.py), a MoE block's Python loop over its experts adds
 * its own, and the decode attention's bf16 `bmm` another. Here each is one call with the GIL
 * released, on torch's own OpenMP threads (this module links libgomp.so.1, which resolves to the
 * copy torch loaded), each weight streamed once through AMX tiles from a layout made for them.
 *
 * Layout: a weight (N, K) packed as (ceil(N/16), K/2, 16, 2) bf16 (amx.pack): a block of 16
 * output columns is one contiguous stream, 16 pairs of K at a time, the layout AMX reads as its
 * second operand.
 *
 * Maths, as the torch paths compute in bf16: sums in fp32 (AMX adds the K dimension 32 at a time
 * in order, as oneDNN does up to 32 rows), each op's result rounded to bf16 where torch's is.
 * The tests say where the bits agree (tests/unit/test_amx.py, tests/moe/test_fused_moe.py).
 * Needs AMX-BF16, AVX-512 F/BW/VL and Linux's leave to use tile data: `supported()` says.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NB 16  /* output columns per packed block */
#define KB 32  /* K per AMX step */

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* fp32 to bf16 bits (in each lane's low half), rounding to nearest even as torch's .to() does;
 * a NaN stays a quiet NaN. */
static AVX512 inline __m512i bf16_bits(__m512 f) {
    const __m512i u = _mm512_castps_si512(f), hi = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}

static AVX512 inline __m512 round_bf16(__m512 f) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(f), 16));
}

static AVX512 inline void store_bf16(uint16_t *p, __m512 f) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(bf16_bits(f)));
}

static AVX512 inline __m512 load_bf16(const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e^x to about one ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts), e^r by its Taylor
 * series to r^7 (the next term is below 1e-8 relative), times 2^n. */
static AVX512 inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    static const float taylor[] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f,
                                   1.f, 1.f};
    __m512 p = _mm512_set1_ps(taylor[0]);
    for (int i = 1; i < 8; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(taylor[i]));
    return _mm512_scalef_ps(p, n);
}

/* One row: h = bf16(bf16(silu(bf16(gate))) * bf16(up)), from the fp32 sums gu = [gate | up]. */
static AVX512 void silu_mul(const float *gu, int I, uint16_t *h) {
    for (int j = 0; j < I; j += 16) {
        const __m512 g = round_bf16(_mm512_loadu_ps(gu + j));
        const __m512 u = round_bf16(_mm512_loadu_ps(gu + I + j));
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 s = round_bf16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
        store_bf16(h + j, _mm512_mul_ps(s, u));
    }
}

static AVX512 void to_bf16(const float *y, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i += 16) store_bf16(out + i, _mm512_loadu_ps(y + i));
}

/* Of lanes i..i+15, those below n (all but at the end). */
static AVX512 inline __mmask16 tail(int i, int n) {
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

/* out[c] = bf16(y[c] + bias[c]) for the n columns of one row (bias bf16, or NULL). */
static AVX512 void cols_to_bf16(const float *y, const uint16_t *bias, int n, uint16_t *out) {
    for (int c = 0; c < n; c += 16) {
        const __mmask16 m = tail(c, n);
        __m512 v = _mm512_maskz_loadu_ps(m, y + c);
        if (bias != NULL)
            v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(
                                     _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bias + c)),
                                     16)));
        _mm256_mask_storeu_epi16(out + c, m, _mm512_cvtepi32_epi16(bf16_bits(v)));
    }
}

/* One token's output row: its k experts' rows (at rows `row` of ys), in increasing expert id,
 * each times its gate weight and rounded to bf16, summed from zero in fp32 and rounded to bf16
 * once (as torch's index_add_ into a bf16 tensor does). */
static AVX512 void combine(const uint16_t *ys, const int64_t *row, const int64_t *ids,
                           const float *top, int k, int H, uint16_t *out) {
    int order[64];
    for (int s = 0; s < k; s++) {  /* insertion sort of the slots by expert id */
        int j = s;
        for (; j > 0 && ids[order[j - 1]] > ids[s]; j--) order[j] = order[j - 1];
        order[j] = s;
    }
    for (int c = 0; c < H; c += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int s = 0; s < k; s++) {
            const int slot = order[s];
            const __m512 v = _mm512_mul_ps(load_bf16(ys + row[slot] * H + c),
                                           _mm512_set1_ps(top[slot]));
            acc = _mm512_add_ps(acc, round_bf16(v));
        }
        store_bf16(out + c, acc);
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static AMX void configure(int rows) {
    TileConfig cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = t < 5 ? rows : 16;
    }
    _tile_loadconfig(&cfg);
}

/* x (M, K) bf16 times the packed W, transposed, over W's blocks first..last-1 (output columns
 * 16 first .. 16 last - 1). The sums go to y (fp32, rows ldy apart) or, with y NULL, to out
 * (bf16 with bias added, rows N apart, columns past N dropped), a tile at a time. Tiles 0-3 hold
 * four blocks' sums (rows x 16 fp32), tile 4 a (rows x 32) slice of x, tiles 5 and 6 (16 pairs
 * x 16 x 2) slices of the blocks. K is a multiple of 32. Each group of blocks is read from memory
 * once: every 16 rows of x pass over it while it sits in cache. */
static AMX void matmul(const uint16_t *x, int M, int K, const uint16_t *wp, int first, int last,
                       float *y, int ldy, uint16_t *out, int N, const uint16_t *bias) {
    const size_t block = (size_t)K * NB;  /* elements per packed block */
    float tmp[16 * 4 * NB];
    int configured = 0;
    for (int b0 = first; b0 < last;) {
        const int four = last - b0 >= 4;  /* else a tail of 1-3 blocks, one at a time */
        const uint16_t *wb = wp + (size_t)b0 * block;
        for (int m0 = 0; m0 < M; m0 += 16) {
            const int rows = M - m0 < 16 ? M - m0 : 16;
            if (rows != configured) {
                configure(rows);
                configured = rows;
            }
            const uint16_t *xr = x + (size_t)m0 * K;
            float *yb = y != NULL ? y + (size_t)m0 * ldy + (size_t)b0 * NB : tmp;
            const int ld = (y != NULL ? ldy : 4 * NB) * 4;  /* bytes */
            _tile_zero(0);
            if (four) {
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int k = 0; k < K; k += KB) {
                    const uint16_t *w = wb + (size_t)k * NB;
                    _tile_loadd(4, xr + k, K * 2);
                    _tile_loadd(5, w, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_loadd(6, w + block, 64);
                    _tile_dpbf16ps(1, 4, 6);
                    _tile_loadd(5, w + 2 * block, 64);
                    _tile_dpbf16ps(2, 4, 5);
                    _tile_loadd(6, w + 3 * block, 64);
                    _tile_dpbf16ps(3, 4, 6);
                }
                _tile_stored(1, yb + NB, ld);
                _tile_stored(2, yb + 2 * NB, ld);
                _tile_stored(3, yb + 3 * NB, ld);
            } else {
                for (int k = 0; k < K; k += KB) {
                    _tile_loadd(4, xr + k, K * 2);
                    _tile_loadd(5, wb + (size_t)k * NB, 64);
                    _tile_dpbf16ps(0, 4, 5);
                }
            }
            _tile_stored(0, yb, ld);
            if (y == NULL) {
                const int c0 = b0 * NB, width = (four ? 4 : 1) * NB;
                const int n = N - c0 < width ? N - c0 : width;
                for (int r = 0; r < rows; r++)
                    cols_to_bf16(tmp + r * 4 * NB, bias != NULL ? bias + c0 : NULL, n,
                                 out + (size_t)(m0 + r) * N + c0);
            }
        }
        b0 += four ? 4 : 1;
    }
    _tile_release();
}

/* scores[s * 16 + g] = bf16(q_g . k_s) * scale for the G <= 16 query heads (the other lanes
 * 0) and all S slots, on AMX: 16 key rows (straight from the cache) times the queries, packed
 * here as pairs of D by 16 heads (zeros past G) into `qp` (16 D bf16). D is a multiple of 32. */
static AMX void scores_qk(const uint16_t *q, int G, int D, const uint16_t *k, int64_t ks, int S,
                          float scale, float *scores, uint16_t *qp) {
    memset(qp, 0, sizeof(uint16_t) * 16 * D);
    for (int g = 0; g < G; g++)
        for (int d = 0; d < D; d++) qp[(d / 2) * 32 + g * 2 + d % 2] = q[(size_t)g * D + d];
    int configured = 0;
    for (int s0 = 0; s0 < S; s0 += 16) {
        const int rows = S - s0 < 16 ? S - s0 : 16;
        if (rows != configured) {
            configure(rows);
            configured = rows;
        }
        _tile_zero(0);
        for (int d = 0; d < D; d += KB) {
            _tile_loadd(4, k + s0 * ks + d, ks * 2);
            _tile_loadd(5, qp + (size_t)d * 16, 64);
            _tile_dpbf16ps(0, 4, 5);
        }
        _tile_stored(0, scores + (size_t)s0 * 16, 64);
    }
    _tile_release();
    for (int s = 0; s < S; s++)
        _mm512_storeu_ps(scores + (size_t)s * 16, _mm512_mul_ps(
            round_bf16(_mm512_loadu_ps(scores + (size_t)s * 16)), _mm512_set1_ps(scale)));
}

/* out (GB heads x 16 nd) = bf16(sum over slots of p[s][g] v_s) for GB query heads at once
 * (GB, nd constants where inlined; GB x nd sums in registers); each value row read once. */
static AVX512 inline __attribute__((always_inline)) void weighted_rows(
        const float *p, const uint16_t *v, int64_t vs, int S, const int GB, const int nd, int D,
        uint16_t *out) {
    __m512 a[4][16];
    for (int g = 0; g < GB; g++)
        for (int j = 0; j < nd; j++) a[g][j] = _mm512_setzero_ps();
    for (int s = 0; s < S; s++) {  /* masked slots too, with p 0, as the torch matmul */
        const uint16_t *vr = v + s * vs;
        for (int j = 0; j < nd; j++) {
            const __m512 vj = load_bf16(vr + 16 * j);
            for (int g = 0; g < GB; g++)
                a[g][j] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)s * 16 + g]), vj, a[g][j]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int j = 0; j < nd; j++) store_bf16(out + (size_t)g * D + 16 * j, a[g][j]);
}

/* The same for one head and any D (a multiple of 16), the sums in `acc` (D floats). */
static AVX512 void weighted_rows_any(const float *p, const uint16_t *v, int64_t vs, int S, int D,
                                     float *acc, uint16_t *out) {
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_setzero_ps());
    for (int s = 0; s < S; s++) {
        const __m512 ps = _mm512_set1_ps(p[(size_t)s * 16]);
        const uint16_t *vr = v + s * vs;
        for (int d = 0; d < D; d += 16)
            _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(ps, load_bf16(vr + d),
                                                      _mm512_loadu_ps(acc + d)));
    }
    for (int d = 0; d < D; d += 16) store_bf16(out + d, _mm512_loadu_ps(acc + d));
}

#define HEADS(GB, ND) weighted_rows(scores + g, v, vs, S, GB, ND, D, out + (size_t)g * D)

/* One row's decode attention for one key/value head: its G <= 16 query heads (G, D) over the S
 * cache slots of keys and values (rows `ks`, `vs` elements apart), slots whose mask byte is 0
 * left out. As fused_decoder's torch path computes it: each score a bf16-rounded dot product
 * times `scale`, an fp32 softmax rounded to bf16, then the weighted sum of values in fp32,
 * rounded to bf16. `scores` holds 16 S floats (a slot's heads side by side, so the softmax runs
 * over all heads at once), `acc` 8 D. D is a multiple of 32. */
static AVX512 void attend(const uint16_t *q, int G, int D, const uint16_t *k, int64_t ks,
                          const uint16_t *v, int64_t vs, const uint8_t *mask, int S,
                          float scale, float *scores, float *acc, uint16_t *out) {
    scores_qk(q, G, D, k, ks, S, scale, scores, (uint16_t *)acc);
    __m512 top = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int s = 0; s < S; s++)
        if (mask[s]) top = _mm512_max_ps(top, _mm512_loadu_ps(scores + (size_t)s * 16));
    for (int s = 0; s < S; s++) {  /* exp(score - top), 0 where masked */
        const __m512 e = mask[s] ? exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + (size_t)s * 16),
                                                        top))
                                 : _mm512_setzero_ps();
        _mm512_storeu_ps(scores + (size_t)s * 16, e);
        sum = _mm512_add_ps(sum, e);
    }
    for (int s = 0; s < S; s++)
        _mm512_storeu_ps(scores + (size_t)s * 16, round_bf16(_mm512_div_ps(
                             _mm512_loadu_ps(scores + (size_t)s * 16), sum)));
    const int nd = D / 16;
    for (int g = 0; g < G;) {  /* as many heads at a time as the registers hold */
        if (nd <= 4 && G - g >= 4) {
            if (nd == 2) HEADS(4, 2); else HEADS(4, 4);
            g += 4;
        } else if (nd <= 8 && G - g >= 2) {
            if (nd == 2) HEADS(2, 2); else if (nd == 4) HEADS(2, 4);
            else if (nd == 6) HEADS(2, 6); else HEADS(2, 8);
            g += 2;
        } else {
            switch (nd) {
            case 2: HEADS(1, 2); break;
            case 4: HEADS(1, 4); break;
            case 6: HEADS(1, 6); break;
            case 8: HEADS(1, 8); break;
            case 12: HEADS(1, 12); break;
            case 16: HEADS(1, 16); break;
            default: weighted_rows_any(scores + g, v, vs, S, D, acc, out + (size_t)g * D);
            }
            g += 1;
        }
    }
}

/* AMX-TILE and AMX-BF16 in CPUID, and Linux's leave to use tile data (asked once per process;
 * oneDNN in torch asks the same). */
static int amx_available(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    /* and AVX-512 F, BW and VL (EBX bits 16, 30, 31), which every AMX CPU has */
    if (!((d >> 22) & 1) || !((d >> 24) & 1) || !((b >> 16) & 1) || !((b >> 30) & 1)
        || !((b >> 31) & 1))
        return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#else
static void matmul(const uint16_t *x, int M, int K, const uint16_t *wp, int first, int last,
                   float *y, int ldy, uint16_t *out, int N, const uint16_t *bias) {
    (void)x; (void)M; (void)K; (void)wp; (void)first; (void)last; (void)y; (void)ldy;
    (void)out; (void)N; (void)bias;
}
static void silu_mul(const float *gu, int I, uint16_t *h) { (void)gu; (void)I; (void)h; }
static void to_bf16(const float *y, size_t n, uint16_t *out) { (void)y; (void)n; (void)out; }
static void combine(const uint16_t *ys, const int64_t *row, const int64_t *ids,
                    const float *top, int k, int H, uint16_t *out) {
    (void)ys; (void)row; (void)ids; (void)top; (void)k; (void)H; (void)out;
}
static void attend(const uint16_t *q, int G, int D, const uint16_t *k, int64_t ks,
                   const uint16_t *v, int64_t vs, const uint8_t *mask, int S, float scale,
                   float *scores, float *acc, uint16_t *out) {
    (void)q; (void)G; (void)D; (void)k; (void)ks; (void)v; (void)vs; (void)mask; (void)S;
    (void)scale; (void)scores; (void)acc; (void)out;
}
static int amx_available(void) { return 0; }
#endif

typedef struct {
    const uint16_t *xs;              /* (pairs, H) bf16: the tokens' rows grouped by expert */
    uint16_t *ys;                    /* (pairs, H) bf16: each expert's output for them */
    const int64_t *counts, *starts;  /* rows per expert, and each expert's first row */
    const uint16_t *gate_up, *down;  /* packed, (E, 2I/16, H/2, 16, 2) and (E, H/16, I/2, 16, 2) */
    int H, I, first, last;           /* this worker's experts: first..last-1 */
    int failed;
} Work;

/* The experts first..last-1 of `w`, one after another. */
static void run_experts(Work *w) {
    const int H = w->H, I = w->I;
    for (int e = w->first; e < w->last; e++) {
        const int n = (int)w->counts[e];
        if (n == 0) continue;
        float *gu = malloc(sizeof(float) * (size_t)n * (2 * I + H) + 2 * (size_t)n * I);
        if (gu == NULL) {
            w->failed = 1;
            return;
        }
        float *y = gu + (size_t)n * 2 * I;
        uint16_t *h = (uint16_t *)(y + (size_t)n * H);
        matmul(w->xs + (size_t)w->starts[e] * H, n, H, w->gate_up + (size_t)e * 2 * I * H,
               0, 2 * I / NB, gu, 2 * I, NULL, 0, NULL);
        for (int r = 0; r < n; r++) silu_mul(gu + (size_t)r * 2 * I, I, h + (size_t)r * I);
        matmul(h, n, I, w->down + (size_t)e * H * I, 0, H / NB, y, H, NULL, 0, NULL);
        to_bf16(y, (size_t)n * H, w->ys + (size_t)w->starts[e] * H);
        free(gu);
    }
}

#define MAX_THREADS 64
static int amx = -1;  /* unknown until asked */

static int supported_now(void) {
    if (amx < 0) amx = amx_available();
    return amx;
}

/* moe(x, tokens, ids, top, k, out, n_experts, gate_up, down, hidden, intermediate, threads),
 * every array as its address: x and out (tokens, H) bf16, ids (tokens, k) int64 experts, top
 * (tokens, k) fp32 gate weights. As fused_moe's torch path: the (token, slot) pairs sorted by
 * expert (stably), each expert over its rows, each output times its gate weight (rounded to
 * bf16), then summed per token in expert order in fp32 and rounded once. The threads split the
 * experts that have rows into runs of about as many experts each: reading an expert's weights,
 * not its few rows, is the cost. */
static PyObject *moe(PyObject *self, PyObject *args) {
    unsigned long long x_p, ids_p, top_p, out_p, gate_up, down;
    int tokens, k, n_experts, H, I, threads;
    if (!PyArg_ParseTuple(args, "KiKKiKiKKiii", &x_p, &tokens, &ids_p, &top_p, &k, &out_p,
                          &n_experts, &gate_up, &down, &H, &I, &threads))
        return NULL;
    if (!supported_now()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU or kernel gives no AMX-BF16: use the "
                        "oneDNN path");
        return NULL;
    }
    if (H % KB || I % KB || n_experts < 1 || k < 1 || k > n_experts || k > 64 || tokens < 0) {
        PyErr_Format(PyExc_ValueError, "hidden %d and intermediate %d must be multiples of %d, "
                     "and 1 <= top-k %d <= experts %d", H, I, KB, k, n_experts);
        return NULL;
    }
    const uint16_t *x = (const uint16_t *)(uintptr_t)x_p;
    const int64_t *ids = (const int64_t *)(uintptr_t)ids_p;
    const float *top = (const float *)(uintptr_t)top_p;
    uint16_t *out = (uint16_t *)(uintptr_t)out_p;
    const size_t pairs = (size_t)tokens * k;
    for (size_t i = 0; i < pairs; i++)
        if (ids[i] < 0 || ids[i] >= n_experts) {
            PyErr_Format(PyExc_ValueError, "expert id %lld out of range (%d experts)",
                         (long long)ids[i], n_experts);
            return NULL;
        }
    int64_t *counts = calloc(3 * (size_t)n_experts + pairs, sizeof(int64_t));
    uint16_t *xs = malloc(2 * pairs * H * sizeof(uint16_t) + 1);
    if (counts == NULL || xs == NULL) {
        free(counts);
        free(xs);
        return PyErr_NoMemory();
    }
    int64_t *starts = counts + n_experts, *fill = starts + n_experts;
    int64_t *row = fill + n_experts;  /* pair -> its row among the sorted pairs */
    uint16_t *ys = xs + pairs * H;
    for (size_t i = 0; i < pairs; i++) counts[ids[i]]++;
    int hit = 0;
    for (int e = 0, s = 0; e < n_experts; s += (int)counts[e], e++) {
        starts[e] = s;
        hit += counts[e] > 0;
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > hit) threads = hit;
    if (threads < 1) threads = 1;
    Work work[MAX_THREADS];
    for (int t = 0, e = 0; t < threads; t++) {
        int want = hit * (t + 1) / threads - hit * t / threads, got = 0, first = e;
        while (e < n_experts && (got < want || t == threads - 1)) got += counts[e++] > 0;
        work[t] = (Work){xs, ys, counts, starts, (const uint16_t *)(uintptr_t)gate_up,
                         (const uint16_t *)(uintptr_t)down, H, I, first, e, 0};
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < pairs; i++) {  /* fill: the rows each expert has taken so far */
        row[i] = starts[ids[i]] + fill[ids[i]]++;
        memcpy(xs + row[i] * H, x + (i / k) * H, (size_t)H * sizeof(uint16_t));
    }
#pragma omp parallel num_threads(threads)
    for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads())
        run_experts(&work[t]);
    for (int t = 0; t < threads; t++) failed |= work[t].failed;
    if (!failed) {
#pragma omp parallel for num_threads(threads)
        for (int t = 0; t < tokens; t++)
            combine(ys, row + (size_t)t * k, ids + (size_t)t * k, top + (size_t)t * k, k, H,
                    out + (size_t)t * H);
    }
    Py_END_ALLOW_THREADS
    free(counts);
    free(xs);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* linear(x, rows, K, w, N, bias, out, threads), every array as its address (bias 0: none):
 * out (rows, N) bf16 = bf16(x (rows, K) bf16 times W (N, K) transposed, plus bias), W packed as
 * (ceil(N/16), K/2, 16, 2) with zero rows after the last (fused_moe.pack). The threads split
 * the blocks of W. */
static PyObject *linear(PyObject *self, PyObject *args) {
    unsigned long long x_p, w_p, bias_p, out_p;
    int rows, K, N, threads;
    if (!PyArg_ParseTuple(args, "KiiKiKKi", &x_p, &rows, &K, &w_p, &N, &bias_p, &out_p,
                          &threads))
        return NULL;
    if (!supported_now()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU or kernel gives no AMX-BF16: use oneDNN");
        return NULL;
    }
    if (K % KB || K < 1 || N < 1 || rows < 0) {
        PyErr_Format(PyExc_ValueError, "in features %d must be a positive multiple of %d, out "
                     "features %d positive", K, KB, N);
        return NULL;
    }
    const int blocks = (N + NB - 1) / NB;
    const uint16_t *x = (const uint16_t *)(uintptr_t)x_p, *w = (const uint16_t *)(uintptr_t)w_p;
    const uint16_t *bias = (const uint16_t *)(uintptr_t)bias_p;
    uint16_t *out = (uint16_t *)(uintptr_t)out_p;
    const int groups = (blocks + 3) / 4;  /* threads take whole groups of four blocks */
    if (threads > groups) threads = groups;
    if (threads < 1) threads = 1;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int first = 4 * (groups * t / nt);
        int last = 4 * (groups * (t + 1) / nt);
        if (last > blocks) last = blocks;
        if (first < last) matmul(x, rows, K, w, first, last, NULL, 0, out, N, bias);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* attention(q, B, H, KV, D, k, v, S, strides, mask, scale, out, threads): one decode step's
 * attention, every array as its address: q (B, H, D) bf16 contiguous; k and v (B, KV, S, D) bf16
 * with element strides (b, head, slot) for each, rows of D contiguous; mask (B, S) bytes; out
 * (B, H, D) bf16. Query head h reads key/value head h / (H / KV). Threads split the rows. */
static PyObject *attention(PyObject *self, PyObject *args) {
    unsigned long long q_p, k_p, v_p, mask_p, out_p;
    int B, H, KV, D, S, threads;
    long long kb, kh, kslot, vb, vh, vslot;
    float scale;
    if (!PyArg_ParseTuple(args, "KiiiiKKiLLLLLLKfKi", &q_p, &B, &H, &KV, &D, &k_p, &v_p, &S,
                          &kb, &kh, &kslot, &vb, &vh, &vslot, &mask_p, &scale, &out_p,
                          &threads))
        return NULL;
    if (!supported_now()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU or kernel gives no AMX-BF16: use torch");
        return NULL;
    }
    if (D % KB || D < KB || KV < 1 || H % KV || H / KV > 16 || S < 1 || B < 0) {
        PyErr_Format(PyExc_ValueError, "head dim %d must be a multiple of %d, and heads %d a "
                     "multiple of key/value heads %d, at most 16 per key/value head", D, KB, H,
                     KV);
        return NULL;
    }
    const uint16_t *q = (const uint16_t *)(uintptr_t)q_p, *k = (const uint16_t *)(uintptr_t)k_p;
    const uint16_t *v = (const uint16_t *)(uintptr_t)v_p;
    const uint8_t *mask = (const uint8_t *)(uintptr_t)mask_p;
    uint16_t *out = (uint16_t *)(uintptr_t)out_p;
    const int G = H / KV;
    const size_t per = (size_t)16 * S + 8 * D;  /* scores, accumulator, packed queries */
    float *scratch = malloc(sizeof(float) * per * B * KV + 1);
    if (scratch == NULL) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads)
    for (int i = 0; i < B * KV; i++) {
        const int b = i / KV, h = i % KV;
        float *scores = scratch + (size_t)i * per;
        attend(q + ((size_t)b * H + (size_t)h * G) * D, G, D, k + b * kb + h * kh, kslot,
               v + b * vb + h * vh, vslot, mask + (size_t)b * S, S, scale, scores,
               scores + (size_t)16 * S, out + ((size_t)b * H + (size_t)h * G) * D);
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    Py_RETURN_NONE;
}

static PyObject *supported(PyObject *self, PyObject *args) {
    return PyBool_FromLong(supported_now());
}

static PyMethodDef methods[] = {
    {"moe", moe, METH_VARARGS,
     "moe(x, tokens, ids, top, k, out, n_experts, gate_up, down, hidden, intermediate, "
     "threads)"},
    {"linear", linear, METH_VARARGS, "linear(x, rows, K, w, N, bias, out, threads)"},
    {"attention", attention, METH_VARARGS,
     "attention(q, B, H, KV, D, k, v, S, k strides (3), v strides (3), mask, scale, out, "
     "threads)"},
    {"supported", supported, METH_NOARGS, "whether this process can run the kernel (AMX-BF16)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_amx", NULL, -1, methods};

PyMODINIT_FUNC PyInit__amx(void) { return PyModule_Create(&module); }
